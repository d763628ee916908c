"""Worker for tests/distributed/test_user_schedule.py: the task's own optimizer and LR schedule
under real Horovod, through the Trainer, uninterrupted and killed-then-resumed, in one job.

The data as users have it: a map-style torch Dataset with dict items and a torch IterableDataset for
validation (torch), a Hugging Face ``datasets.Dataset`` with chosen columns and an unbatched
``tf.data.Dataset`` for validation (Keras).

``python user_schedule.py FRAMEWORK REPORT_JSON OUTPUT_DIR [KEY=VALUE ...]``, under ``horovodrun -np 2``. Three runs in
this process (and two more below): ``reference`` (two epochs), ``run`` stopped by an exception at optimizer step
:data:`STOP` (as if killed, after the step-:data:`EVERY` checkpoints), then ``run`` again with
``checkpoint.resume=true`` (torch: and ``zero2``, uninterrupted with ``parallel.shard_optimizer=gradients``);
``limited`` with ``train.max_steps`` = :data:`STOP`, then ``continued`` from its stop without the limit. torch: AdamW(lr=1e-3) + OneCycleLR, with an optimizer step pre-hook
that records the LR each real update uses (and shows the start-up step fires no hook). Keras:
AdamW built with a CosineDecay for the reference, and a plain AdamW with the CosineDecay as
``TrainTask.scheduler`` for the interrupted and resumed runs (both ways must be the same run).
Rank 0 writes the report: the LRs used, logged and stepped by hand, ``metrics.jsonl``'s, the final
weights, the optimizer's update count, ``config.yaml``'s optim section.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hvdtrain.core.callbacks import Callback
from hvdtrain.trainer import Trainer
from hvdtrain.core.registry import define_recipe, register_recipe
from hvdtrain.core.resolve import load_config
from hvdtrain.core.sources import as_source
from hvdtrain.core.task import TrainTask

N, FEATURES, CLASSES, BATCH, EPOCHS = 64, 4, 3, 4, 2
UPDATES = EPOCHS * N // (2 * BATCH)  # 2 ranks: 8 updates per epoch
EVERY, STOP = 3, 11  # step checkpoints every 3 updates; the interrupted run dies after update 11 (epoch 2)
MAX_LR, COSINE = 0.01, dict(initial_learning_rate=1e-2, decay_steps=UPDATES, alpha=0.1)


class Stop(Exception):
    """Stands for the process dying."""


class Watch(Callback):
    """The LR the loop logs for every micro-batch; stops the run at optimizer step ``stop``."""

    def __init__(self, stop: int | None = None) -> None:
        self.stop, self.logged = stop, []

    def on_step_end(self, epoch, step, logs):
        self.logged.append(float(logs["lr"]))
        if logs["global_step"] == self.stop:
            raise Stop()


def arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N + 16, FEATURES)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)


def torch_data() -> tuple[Any, Any]:
    """A map-style torch Dataset with dict items (``{"features": tensor, "label": int}``), and the
    validation rows as a torch IterableDataset of the same items."""
    import torch

    class Rows(torch.utils.data.Dataset):
        def __init__(self, x, y):
            self.x, self.y = torch.from_numpy(x), y

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return {"features": self.x[i], "label": int(self.y[i])}

    class Stream(torch.utils.data.IterableDataset):  # the validation data as a stream (read into memory)
        def __init__(self, x, y):
            self.x, self.y = torch.from_numpy(x), y

        def __iter__(self):
            return ({"features": self.x[i], "label": int(self.y[i])} for i in range(len(self.y)))

    x, y = arrays()
    return Rows(x[:N], y[:N]), Stream(x[N:], y[N:])


def hf_data() -> tuple[Any, Any]:
    """A Hugging Face datasets.Dataset with a features column and a label column."""
    import datasets

    x, y = arrays()
    table = datasets.Dataset.from_dict({"features": x, "label": y, "note": [f"row {i}" for i in range(len(y))]})
    return table.select(range(N)), table.select(range(N, N + 16))


def torch_task(seen: dict) -> TrainTask:
    import torch
    import torch.nn.functional as F

    class Net(torch.nn.Module):  # called as model(**inputs): the items' non-label columns
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(FEATURES, CLASSES)

        def forward(self, features):
            return self.linear(features)

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=MAX_LR, total_steps=UPDATES)
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen["used"].append(opt.param_groups[0]["lr"]))
    seen["weights"] = lambda: [p.detach().numpy().copy() for p in model.parameters()]
    seen["updates"] = lambda: int(max((s["step"] for s in optimizer.state.values()), default=-1))  # -1: a copy steps
    train, val = torch_data()
    seen["sources"] = lambda: [type(task.train_data).__name__, type(task.val_data).__name__]
    task = TrainTask(model=model, optimizer=optimizer, scheduler=scheduler, loss_fn=F.cross_entropy,
                     train_data=train, val_data=val,
                     metric_sums=lambda out, y: {"correct": (out.argmax(1) == y).sum()})
    return task


def torch_by_hand() -> list[float]:
    import torch

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=MAX_LR, total_steps=UPDATES)
    lrs = []
    for _ in range(UPDATES):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def keras_task(seen: dict, as_scheduler: bool) -> TrainTask:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    features = keras.Input((FEATURES,), name="features")
    model = keras.Model(inputs={"features": features}, outputs=keras.layers.Dense(CLASSES)(features))
    schedule = keras.optimizers.schedules.CosineDecay(**COSINE)
    optimizer = keras.optimizers.AdamW(learning_rate=1e-3 if as_scheduler else schedule)
    seen["weights"] = lambda: [np.array(v.numpy()) for v in model.trainable_variables]
    seen["updates"] = lambda: int(optimizer.iterations.numpy())
    train = as_source(hf_data()[0], inputs=["features"])  # the text column left out
    x, y = arrays()  # validation: an unbatched tf.data pipeline, read into memory
    val = tf.data.Dataset.from_tensor_slices(({"features": x[N:]}, y[N:])).map(lambda row, label: (row, label))

    def loss_fn(logits, y):
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    task = TrainTask(model=model, optimizer=optimizer, scheduler=schedule if as_scheduler else None,
                     loss_fn=loss_fn, train_data=train, val_data=val,
                     metric_sums=lambda out, y: {"correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(out, 1), y),
                                                                                  tf.float32))})
    seen["sources"] = lambda: [type(task.train_data).__name__, type(task.val_data).__name__]
    return task


def keras_by_hand() -> list[float]:
    import keras

    schedule = keras.optimizers.schedules.CosineDecay(**COSINE)
    return [float(schedule(step)) for step in range(UPDATES)]


def main() -> None:
    framework, report_path, root = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    seen: dict = {"used": []}
    define_recipe("user-schedule", description="own optimizer and schedule", defaults={}, replace=True)
    as_scheduler = {"flag": False}
    register_recipe("user-schedule", framework=framework, replace=True)(
        lambda config, ctx: torch_task(seen) if framework == "torch" else keras_task(seen, as_scheduler["flag"]))
    report: dict = {}
    common = [f"framework={framework}", "recipe=user-schedule", f"train.epochs={EPOCHS}", f"train.batch_size={BATCH}",
              "train.log_every=0", "train.tensorboard=false", "train.progress_bar=false",
              f"checkpoint.every_steps={EVERY}", "checkpoint.keep_last=100", *sys.argv[4:]]  # extra: KEY=VALUE
    rank = 0
    runs = [("reference", "reference", [], None), ("stopped", "run", [], STOP),
            ("resumed", "run", ["checkpoint.resume=true"], None),
            # train.max_steps: a run that ends at update STOP (inside epoch 2), then goes on without the limit
            ("limited", "limited", [f"train.max_steps={STOP}"], None),
            ("continued", "limited", ["checkpoint.resume=true"], None)]
    if framework == "torch":  # ZeRO-2: the scheduler drives the shard optimizer's groups
        runs.append(("zero2", "zero2", ["parallel.shard_optimizer=gradients"], None))
    for name, output, extra, stop in runs:
        as_scheduler["flag"] = name != "reference"
        seen["used"] = []
        watch = Watch(stop)
        config = load_config({}, overrides=[*common, f"output={root / output}", *extra])
        trainer = Trainer(config, callbacks=[watch])
        try:
            trainer.fit()
        except Stop:
            pass
        rank = trainer.ctx.rank
        report[name] = {"used": [float(v) for v in seen["used"]], "logged": watch.logged,
                        "weights": [w.tolist() for w in seen["weights"]()], "updates": seen["updates"](),
                        "sources": seen["sources"](), "val_loss": [json.loads(line).get("val_loss") for line in
                                                                   (root / output / "metrics.jsonl").read_text()
                                                                   .splitlines()] if rank == 0 else None}
    report["by_hand"] = torch_by_hand() if framework == "torch" else keras_by_hand()  # after TF's set-up
    if rank == 0:
        run = root / "run"
        report["metrics_lr"] = {out: [json.loads(line)["lr"] for line in (root / out / "metrics.jsonl").read_text()
                                      .splitlines()] for out in ("reference", "run")}
        report["optim"] = yaml.safe_load((run / "config.yaml").read_text())["optim"]
        report["limited_rows"] = [[row["epoch"], row["step"]] for row in map(
            json.loads, (root / "limited" / "metrics.jsonl").read_text().splitlines())]
        report["limited_checkpoints"] = sorted(p.name for p in (root / "limited" / "checkpoints").iterdir())
        report_path.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
