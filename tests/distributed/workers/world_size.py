"""Worker for tests/distributed/test_world_size.py (issue 42): one training run with a fixed
global batch through the Trainer under real Horovod, at whatever world size it is launched.

``python world_size.py REPORT_JSON OUTPUT_DIR [KEY=VALUE ...]`` under ``horovodrun -np N``. The
model is a small ResNet-18-like network (a stem and two residual blocks, BatchNorm after every
convolution, dropout before the classifier) on 8x8 RGB images with a random flip keyed by
(seed, epoch, sample); ``model.dropout`` in the extra keys is not a config key, so the dropout
rate is the worker's own argument ``--dropout=P`` (default 0); ``--stop-at=S`` stops every rank
before global step S (as if the job died there; its checkpoints stay for a ``--resume``). Rank 0
writes the report: the SHA-256 of the model's parameters and buffers after every update this run
took, the final parameters, and ``metrics.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.loop import Trainer
from hvdtrain.core.registry import define_recipe, register_recipe
from hvdtrain.core.resolve import load_config
from hvdtrain.core.task import ArrayDataset, TrainTask

TRAIN, VAL, SIZE, CLASSES = 96, 24, 8, 4


def images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3, SIZE, SIZE)).astype(np.float32)
    y = ((x[:, 0, :4].mean(axis=(1, 2)) > 0).astype(np.int64) * 2 + (x[:, 1, :, :4].mean(axis=(1, 2)) > 0))
    return x, y.astype(np.int64)


def flip(x, y, indices, epoch):
    """A horizontal flip keyed by (epoch, sample): the same at any world size."""
    coins = np.array([np.random.default_rng([7, epoch, int(i)]).random() < 0.5 for i in indices])
    return np.where(coins[:, None, None, None], x[..., ::-1], x).copy(), y


def model_fn(dropout: float):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.skip = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + self.skip(x))

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         Block(8, 8, 1), Block(8, 16, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Dropout(dropout), nn.Linear(16, CLASSES))


class Stop(Exception):
    """Stands for the job dying (every rank at the same step)."""


class Hashes(Callback):
    """The SHA-256 of the model's state after every update."""

    def __init__(self, model, start: int) -> None:
        self.model, self.hashes, self.step, self.first = model, [], start, start + 1

    def on_step_end(self, epoch, step, logs):
        if logs["global_step"] != self.step:
            self.step = logs["global_step"]
            digest = hashlib.sha256()
            for name, tensor in self.model.state_dict().items():
                digest.update(name.encode())
                digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
            self.hashes.append(digest.hexdigest())


def main() -> None:
    import torch.nn.functional as F

    from hvdtrain.torch.adapter import build_optimizer

    report_path, output = Path(sys.argv[1]), Path(sys.argv[2])
    dropout, stop_at = 0.0, None
    extra = []
    for arg in sys.argv[3:]:
        if arg.startswith("--dropout="):
            dropout = float(arg.split("=", 1)[1])
        elif arg.startswith("--stop-at="):
            stop_at = int(arg.split("=", 1)[1])
        else:
            extra.append(arg)
    built = {}

    def build(config, ctx):
        model = built["model"] = model_fn(dropout)
        x, y = images(TRAIN + VAL, 3)
        return TrainTask(model=model, optimizer=build_optimizer(model.parameters(), config.optim),
                         loss_fn=F.cross_entropy, train_data=ArrayDataset(x[:TRAIN], y[:TRAIN], flip),
                         val_data=ArrayDataset(x[TRAIN:], y[TRAIN:]),
                         metric_sums=lambda out, t: {"correct": (out.argmax(1) == t).sum()})

    define_recipe("world-size", description="issue 42's small ResNet", defaults={}, replace=True)
    register_recipe("world-size", framework="torch", replace=True)(build)
    config = load_config({}, overrides=["framework=torch", "recipe=world-size", f"output={output}",
                                        "train.log_every=0", "train.tensorboard=false", "train.progress_bar=false",
                                        "checkpoint.enabled=false", "optim.lr=0.05", "optim.warmup_epochs=0.5",
                                        *extra])
    hashes = None

    class Late(Callback):  # the model exists once the recipe is built: hash from the first step
        def on_step_begin(self, epoch, step, logs):
            nonlocal hashes
            hashes = hashes or Hashes(built["model"], logs["global_step"])  # a resumed run: after its start
            if logs["global_step"] == stop_at:
                raise Stop()

        def on_step_end(self, epoch, step, logs):
            hashes.on_step_end(epoch, step, logs)

    trainer = Trainer(config, callbacks=[Late()])
    try:
        trainer.fit()
    except Stop:
        pass
    if trainer.ctx.rank == 0:
        rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
        report_path.write_text(json.dumps({
            "world_size": trainer.ctx.size, "hashes": hashes.hashes, "metrics": rows,
            "params": [p.detach().numpy().ravel().tolist() for p in built["model"].parameters()],
            "hashes_from": hashes.first if hashes else None}))


if __name__ == "__main__":
    main()
