"""Worker for tests/distributed/test_bert_finetune.py: train bert-finetune under horovodrun -np 2,
then compare every rank's parameters.

Usage: ``bert_ranks.py REPORT_PATH FRAMEWORK KEY=VALUE...`` (config overrides). Rank 0 writes a
JSON report: world size, the largest difference between any rank's parameters and rank 0's
(``spread``), how far training moved the parameters from the pretrained start (``moved``), and
the epoch history.
"""

import json
import sys

import numpy as np

import hvdtrain
from hvdtrain_recipes.bert_finetune import pretrained

report_path, framework, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
config = hvdtrain.load_config(hvdtrain.get_recipe("bert-finetune").defaults, overrides=overrides,
                              recipe="bert-finetune", framework=framework)
trainer = hvdtrain.Trainer(config)
result = trainer.fit()
model = trainer.adapter.model
model_dir = pretrained.resolve_model_dir(config.model.name)

if framework == "torch":
    from hvdtrain_recipes.bert_finetune.torch_recipe import LogitsOnly, load_model

    def flat(m):
        return np.concatenate([p.detach().double().numpy().ravel() for p in m.parameters()])

    start = flat(LogitsOnly(load_model(model_dir, ["0", "1"], config.train.seed)))
else:
    from hvdtrain_recipes.bert_finetune.tf_recipe import load_model

    def flat(m):
        return np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in m.trainable_variables])

    start = flat(load_model(model_dir, pretrained.read_model_config(model_dir), ["0", "1"], config.train.seed))

mine = flat(model)
everyone = trainer.adapter.allgather_object(mine)  # distributed: every rank's parameters, on every rank
if trainer.ctx.rank == 0:
    with open(report_path, "w") as f:
        json.dump({"world_size": len(everyone), "spread": float(max(np.abs(v - mine).max() for v in everyone)),
                   "moved": float(np.abs(mine - start).max()), "history": result.history}, f)
