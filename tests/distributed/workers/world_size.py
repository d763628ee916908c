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
    """A horizontal flip keyed by (epoch, sample): the same at any world size (NCHW or NHWC: the
    width is the last axis but for a 3-channel last axis)."""
    coins = np.array([np.random.default_rng([7, epoch, int(i)]).random() < 0.5 for i in indices])
    flipped = x[..., ::-1] if x.shape[-1] != 3 else x[:, :, ::-1]
    return np.where(coins[:, None, None, None], flipped, x).copy(), y


def keras_model(dropout: float):
    """The same network in Keras (channels last)."""
    import keras
    from keras import layers

    def block(x, cout, stride):
        out = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(cout, 3, stride, "same", use_bias=False)(x)))
        out = layers.BatchNormalization()(layers.Conv2D(cout, 3, 1, "same", use_bias=False)(out))
        skip = x if stride == 1 and x.shape[-1] == cout else \
            layers.BatchNormalization()(layers.Conv2D(cout, 1, stride, use_bias=False)(x))
        return layers.ReLU()(layers.Add()([out, skip]))

    keras.utils.set_random_seed(0)
    inputs = keras.Input((SIZE, SIZE, 3))
    x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(8, 3, 1, "same", use_bias=False)(inputs)))
    x = block(block(x, 8, 1), 16, 2)
    x = layers.Dropout(dropout)(layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, layers.Dense(CLASSES)(x))


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


def state(model):
    """(name, array) of the model's parameters and buffers: torch's state_dict, Keras's weights."""
    if hasattr(model, "state_dict"):
        return [(k, t.detach().cpu().numpy()) for k, t in model.state_dict().items()]
    return [(v.path, np.asarray(v.numpy())) for v in model.weights]


def params(model):
    """The trainable parameters as arrays (without BatchNorm's statistics and counters)."""
    if hasattr(model, "state_dict"):
        return [p.detach().numpy() for p in model.parameters()]
    return [np.asarray(v.numpy()) for v in model.trainable_weights]


class Stop(Exception):
    """Stands for the job dying (every rank at the same step)."""


class Hashes(Callback):
    """The SHA-256 of the model's state after every update (an update run again after an elastic
    rollback: its last run's)."""

    def __init__(self, model, start: int) -> None:
        self.model, self.by_step, self.step, self.first = model, {}, start, start + 1

    @property
    def hashes(self) -> list[str]:
        return [self.by_step[k] for k in sorted(self.by_step)]

    def on_step_end(self, epoch, step, logs):
        if logs["global_step"] != self.step:
            self.step = logs["global_step"]
            digest = hashlib.sha256()
            for name, array in state(self.model):
                digest.update(name.encode())
                digest.update(np.ascontiguousarray(array).tobytes())
            self.by_step[self.step] = digest.hexdigest()


def torch_task(config, dropout):
    import torch.nn.functional as F

    from hvdtrain.torch.adapter import build_optimizer

    model = model_fn(dropout)
    x, y = images(TRAIN + VAL, 3)
    return model, TrainTask(model=model, optimizer=build_optimizer(model.parameters(), config.optim),
                            loss_fn=F.cross_entropy, train_data=ArrayDataset(x[:TRAIN], y[:TRAIN], flip),
                            val_data=ArrayDataset(x[TRAIN:], y[TRAIN:]),
                            metric_sums=lambda out, t: {"correct": (out.argmax(1) == t).sum()})


def keras_task(config, dropout):
    import keras
    import tensorflow as tf

    from hvdtrain.tensorflow.optimizers import build_optimizer

    model = keras_model(dropout)
    x, y = images(TRAIN + VAL, 3)
    x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))

    def loss_fn(logits, t):
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(t, logits, from_logits=True))

    return model, TrainTask(model=model, optimizer=build_optimizer(config.optim), loss_fn=loss_fn,
                            train_data=ArrayDataset(x[:TRAIN], y[:TRAIN], flip),
                            val_data=ArrayDataset(x[TRAIN:], y[TRAIN:]),
                            metric_sums=lambda out, t: {"correct": tf.reduce_sum(tf.cast(
                                tf.equal(tf.argmax(out, 1), tf.cast(t, tf.int64)), tf.float32))})


def main() -> None:
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

    framework = next((a.split("=", 1)[1] for a in extra if a.startswith("framework=")), "torch")

    def build(config, ctx):
        built["model"], task = (torch_task if framework == "torch" else keras_task)(config, dropout)
        return task

    define_recipe("world-size", description="issue 42's small ResNet", defaults={}, replace=True)
    register_recipe("world-size", framework=framework, replace=True)(build)
    config = load_config({}, overrides=[f"framework={framework}", "recipe=world-size", f"output={output}",
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
            "params": [a.ravel().tolist() for a in params(built["model"])],
            "hashes_from": hashes.first if hashes else None}))


if __name__ == "__main__":
    main()
