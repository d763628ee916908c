"""Worker for tests/distributed/test_finetune.py: the image recipe's ResNet-18 from a torchvision-layout
weights file, with fine-tuning overrides; every rank's fingerprints of the backbone (parameters and
BatchNorm statistics) and of the head, after the broadcast and after every epoch, gathered to rank 0.

    horovodrun -np 2 -H localhost:2 --gloo python finetune_ranks.py REPORT.json FRAMEWORK KEY=VALUE ...
"""

import hashlib
import json
import sys

import numpy as np

import hvdtrain
from hvdtrain_recipes.image_classification.torchvision_weights import read_state_dict


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def fingerprints(adapter, framework: str) -> dict:
    """Backbone and head fingerprints, and whether the backbone still holds the file's conv1."""
    control = adapter.control
    if framework == "torch":
        backbone = [p.detach().cpu().numpy() for p in control.backbone]
        backbone += [b.cpu().numpy() for m in control.norms for b in (m.running_mean, m.running_var)]
        head = [p.detach().cpu().numpy() for p in adapter.model.parameters() if id(p) not in control.backbone_ids]
        conv1 = adapter.model.stem[0].weight.detach().cpu().numpy()
    else:
        backbone = [v.numpy() for v in control.backbone]
        backbone += [v.numpy() for v in adapter.model.variables if id(v) in control.frozen_stats]
        head = [v.numpy() for v, is_head in zip(adapter.trainable, control.head_mask) if is_head]
        inner = next(layer for layer in adapter.model.layers if hasattr(layer, "torchvision_layers"))
        conv1 = inner.get_layer(inner.torchvision_layers["conv1"]).kernel.numpy().transpose(3, 2, 0, 1)
    return {"backbone": _digest(backbone), "head": _digest(head), "conv1": conv1}


class Record(hvdtrain.Callback):
    """Every rank's fingerprints after the broadcast and after each epoch (a collective: every rank
    calls it at the same point)."""

    def __init__(self, framework: str, weights: str):
        self.framework, self.trainer, self.rows = framework, None, []
        self.file_conv1 = read_state_dict(weights)["conv1.weight"]

    def _gather(self, when: str) -> None:
        prints = fingerprints(self.trainer.adapter, self.framework)
        prints["conv1_is_the_files"] = bool(np.array_equal(prints.pop("conv1"), self.file_conv1))
        self.rows.append({"when": when, "ranks": self.trainer.adapter.allgather_object(prints)})

    def on_train_begin(self, ctx, info):
        self._gather("start")

    def on_epoch_end(self, epoch, record):
        self._gather(f"epoch {epoch + 1}")


def main():
    report, framework, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    config = hvdtrain.load_config(hvdtrain.get_recipe("image-classification").defaults, overrides=overrides,
                                  recipe="image-classification", framework=framework)
    recorder = Record(framework, config.model.pretrained)
    trainer = recorder.trainer = hvdtrain.Trainer(config, callbacks=[recorder])
    result = trainer.fit()
    if trainer.ctx.is_main:
        with open(report, "w") as f:
            json.dump({"rows": recorder.rows, "history": result.history}, f)


if __name__ == "__main__":
    main()
