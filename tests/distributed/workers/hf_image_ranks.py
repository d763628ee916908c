"""Worker for tests/distributed/test_hf_image_finetune.py: fine-tune a Hugging Face image model with
the image-classification recipe under horovodrun -np 2, then compare every rank's parameters.

Usage: ``hf_image_ranks.py REPORT_PATH FRAMEWORK KEY=VALUE...`` (config overrides). Rank 0 writes a
JSON report: world size, the largest difference between any rank's parameters and rank 0's
(``spread``), how far training moved them from the pretrained start (``moved``: all, ``head_moved``:
the classifier's; ``backbone_moved``: the summed change of every other parameter) and the epoch history.
"""

import json
import sys
from pathlib import Path

import numpy as np

import hvdtrain
from hvdtrain_recipes.image_classification import hf_models

report_path, framework, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
config = hvdtrain.load_config(hvdtrain.get_recipe("image-classification").defaults, overrides=overrides,
                              recipe="image-classification", framework=framework)
trainer = hvdtrain.Trainer(config)
result = trainer.fit()
model = trainer.adapter.model
hf = hf_models.resolve(config.model.name)
labels = sorted(p.name for p in (Path(config.data.path) / "train").iterdir())  # the class folders

if framework == "torch":
    from hvdtrain_recipes.image_classification.hf_torch import load_model

    def flat(m, head=False):
        params = m.model.classifier.parameters() if head else m.parameters()
        return np.concatenate([p.detach().double().numpy().ravel() for p in params])

    initial = load_model(hf, labels, config.train.seed)
else:
    from hvdtrain_recipes.image_classification.hf_keras import load_model

    def flat(m, head=False):
        variables = m.get_layer(hf_models.HEAD_NAME).trainable_variables if head else m.trainable_variables
        return np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in variables])

    size = hf.preprocessing.size
    initial = load_model(hf, labels, config.train.seed, (size, size, 3))

mine, start = flat(model), flat(initial)
head_moved = float(np.abs(flat(model, head=True) - flat(initial, head=True)).max())
everyone = trainer.adapter.allgather_object(mine)  # distributed: every rank's parameters, on every rank
if trainer.ctx.rank == 0:
    with open(report_path, "w") as f:
        json.dump({"world_size": len(everyone), "spread": float(max(np.abs(v - mine).max() for v in everyone)),
                   "moved": float(np.abs(mine - start).max()), "head_moved": head_moved,
                   "backbone_moved": float(np.abs(mine - start).sum() - np.abs(flat(model, True) - flat(initial, True)).sum()),
                   "history": result.history}, f)
