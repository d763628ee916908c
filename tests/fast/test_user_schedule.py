"""The task's own optimizer and LR scheduler run as given (hvdtrain.core.optimizer_policy), in-process.

Recipe ``toy-own`` builds its own optimizer (an :class:`SGD` that is not built from ``optim.*``)
and, when asked, its own scheduler (:class:`OneCycle`, stepped once per update like a torch
``LRScheduler``). :class:`OwnAdapter` is the NumPy adapter that applies that optimizer's LR, reads
it back, steps and checkpoints the scheduler: what the torch and Keras adapters do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from numpy_adapter import N_CLASSES, N_FEATURES, LinearSoftmax, NumpyAdapter, cross_entropy_sum, toy_data
from toyrun import Interrupt, StopAt

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.config import ConfigError
from hvdtrain.trainer import Trainer
from hvdtrain.core.optimizer_policy import OptimizerFacts
from hvdtrain.core.registry import define_recipe, register_recipe, unregister_recipe
from hvdtrain.core.resolve import load_config
from hvdtrain.core.task import ArrayDataset, TrainTask

pytestmark = pytest.mark.lr_schedule

RECIPE = "toy-own"
EPOCHS, UPDATES_PER_EPOCH = 2, 12  # 96 samples in batches of 8
QUIET = ["train.tensorboard=false", "train.progress_bar=false", "train.log_every=0", "train.batch_size=8",
         f"train.epochs={EPOCHS}"]


class SGD:
    """The task's own optimizer: only an LR and a momentum, built by the recipe itself."""

    def __init__(self, lr: float, momentum: float = 0.9) -> None:
        self.lr, self.base_lr, self.momentum = lr, lr, momentum


class OneCycle:
    """A one-cycle schedule over ``total`` updates, stepped after each (like torch's OneCycleLR)."""

    def __init__(self, optimizer: SGD, max_lr: float, total: int) -> None:
        self.optimizer, self.max_lr, self.total, self.count = optimizer, max_lr, total, 0
        optimizer.lr = self.value(0)

    def value(self, step: int) -> float:
        up = 0.3 * self.total
        low = self.max_lr / 25
        if step <= up:
            return low + (self.max_lr - low) * step / up
        return low / 1e4 + (self.max_lr - low / 1e4) * 0.5 * (1 + math.cos(math.pi * (step - up) / (self.total - up)))

    def step(self) -> None:
        self.count += 1
        self.optimizer.lr = self.value(self.count)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "lr": self.optimizer.lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.optimizer.lr = state["count"], state["lr"]


def by_hand(max_lr: float, updates: int) -> list[float]:
    """The LR of every update when the same schedule is stepped by hand."""
    optimizer = SGD(1.0)
    schedule = OneCycle(optimizer, max_lr, EPOCHS * UPDATES_PER_EPOCH)
    lrs = []
    for _ in range(updates):
        lrs.append(optimizer.lr)
        schedule.step()
    return lrs


class OwnAdapter(NumpyAdapter):
    """The NumPy adapter for a task that brings its own optimizer (and scheduler)."""

    def describe_optimizer(self, task: TrainTask) -> OptimizerFacts:
        scheduler = task.scheduler
        return OptimizerFacts("test_user_schedule.SGD", task.optimizer.lr, task.optimizer.base_lr, False,
                              "test_user_schedule.OneCycle" if scheduler is not None else None)

    def prepare(self, task: TrainTask, config: Any) -> None:
        super().prepare(task, config)
        self.own, self.scheduler = task.optimizer, task.scheduler
        self.momentum = task.optimizer.momentum

    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True, weight: float | None = None) -> Any:
        if self.task_lr:
            self.lr = self.own.lr  # the task's optimizer's LR is what the update uses
        return super().train_step(inputs, targets, apply_update, weight)

    def learning_rate(self) -> float:
        return self.own.lr

    def step_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()

    def save_state(self, directory: Path) -> None:
        super().save_state(directory)
        if self.scheduler is not None:
            (Path(directory) / "scheduler.json").write_text(json.dumps(self.scheduler.state_dict()))

    def load_state(self, directory: Path) -> None:
        super().load_state(directory)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(json.loads((Path(directory) / "scheduler.json").read_text()))


@pytest.fixture
def own_recipe():
    """Recipe ``toy-own``: its optimizer SGD(lr) and, with ``max_lr``, its OneCycle scheduler."""
    made: dict[str, Any] = {"lr": 0.05, "max_lr": None, "defaults": {}}
    x_train, y_train, x_val, y_val = toy_data()

    def define(**options: Any) -> None:
        made.update(options)
        define_recipe(RECIPE, description="own optimizer", defaults=made["defaults"], replace=True)
        register_recipe(RECIPE, framework="torch", replace=True)(build)

    def build(config: Any, ctx: Any) -> TrainTask:
        rng = np.random.default_rng(config.train.seed)
        model = LinearSoftmax({"weight": rng.normal(0.0, 0.1, (N_FEATURES, N_CLASSES)), "bias": np.zeros(N_CLASSES)})
        optimizer = SGD(made["lr"])
        scheduler = OneCycle(optimizer, made["max_lr"], EPOCHS * UPDATES_PER_EPOCH) if made["max_lr"] else None
        return TrainTask(model=model, optimizer=optimizer, loss_fn=cross_entropy_sum, scheduler=scheduler,
                         train_data=ArrayDataset(x_train, y_train), val_data=ArrayDataset(x_val, y_val),
                         metric_sums=lambda logits, y: {"correct": float((logits.argmax(axis=1) == y).sum())})

    define()
    yield define
    unregister_recipe(RECIPE)


class Logged(Callback):
    """The LR the loop reports after every micro-batch."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_step_end(self, epoch, step, logs):
        self.lrs.append(logs["lr"])


def run(output: Path, *overrides: str, callbacks=(), adapter: OwnAdapter | None = None) -> OwnAdapter:
    adapter = adapter or OwnAdapter()
    config = load_config({}, overrides=[f"recipe={RECIPE}", f"output={output}", *QUIET, *overrides])
    Trainer(config, adapter=adapter, callbacks=list(callbacks)).fit()
    return adapter


def metrics(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def test_the_tasks_scheduler_sets_every_updates_lr_and_the_logs_say_so(tmp_path, own_recipe):
    own_recipe(max_lr=0.2)
    logged = Logged()
    adapter = run(tmp_path, callbacks=[logged])
    expected = by_hand(0.2, EPOCHS * UPDATES_PER_EPOCH)
    assert adapter.applied_lrs == expected  # exactly: the same arithmetic, stepped once per update
    assert len(set(expected)) > 20
    assert logged.lrs == expected  # the progress line's LR is the one used
    assert [r["lr"] for r in metrics(tmp_path)] == [expected[11], expected[23]]
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())["optim"]
    assert saved["ran"] == "test_user_schedule.SGD + test_user_schedule.OneCycle"
    assert saved["schedule"] == "task" and "name" not in saved and "warmup_epochs" not in saved
    from hvdtrain.reporting import load_run, summary_lines  # hvdtrain report's summary

    assert dict(summary_lines(load_run(tmp_path)))["optimizer"] == (
        f"test_user_schedule.SGD + test_user_schedule.OneCycle (the task's own), LR {expected[0]} at the start")


@pytest.mark.parametrize("stop_at", [7, 17])  # inside epoch 1 (after the step-5 checkpoint), inside epoch 2
def test_the_tasks_scheduler_resumes_exactly(tmp_path, own_recipe, stop_at):
    own_recipe(max_lr=0.2)
    every = ["checkpoint.every_steps=5", "checkpoint.keep_last=100"]
    reference = run(tmp_path / "reference", *every)
    with pytest.raises(Interrupt):
        run(tmp_path / "run", *every, callbacks=[StopAt(stop_at)])
    resumed = run(tmp_path / "run", *every, "checkpoint.resume=true")
    done = (stop_at // 5) * 5 if stop_at < UPDATES_PER_EPOCH else max(UPDATES_PER_EPOCH, (stop_at // 5) * 5)
    assert resumed.applied_lrs == reference.applied_lrs[done:]
    assert [r["lr"] for r in metrics(tmp_path / "run")] == [r["lr"] for r in metrics(tmp_path / "reference")]
    for k, v in reference.model.params.items():
        assert np.array_equal(resumed.model.params[k], v)


def test_optim_defaults_never_touch_the_tasks_optimizer(tmp_path, own_recipe):
    own_recipe(lr=0.03)  # optim.lr's default 0.01, scaled and scheduled, is not what runs
    adapter = run(tmp_path)
    assert adapter.applied_lrs == [0.03] * (EPOCHS * UPDATES_PER_EPOCH)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["optim"]["lr"] == 0.03


@pytest.mark.parametrize("override, named", [
    ("optim.name=adam", "optim.name=adam contradicts the task's optimizer test_user_schedule.SGD"),
    ("optim.lr=0.2", "optim.lr=0.2 contradicts the task's optimizer SGD (built with lr 0.05)"),
])
def test_a_contradicting_optim_key_is_refused_by_name(tmp_path, own_recipe, override, named):
    with pytest.raises(ConfigError, match="^" + named.replace("(", r"\(").replace(")", r"\)")):
        run(tmp_path, override)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_a_key_that_agrees_is_accepted_and_a_schedule_key_is_named(tmp_path, own_recipe, capsys):
    adapter = run(tmp_path, "optim.name=sgd", "optim.lr=0.05", "optim.warmup_epochs=0.5")
    assert adapter.applied_lrs == [0.05] * (EPOCHS * UPDATES_PER_EPOCH)
    warning = [line for line in capsys.readouterr().out.splitlines() if "not applied" in line]
    assert warning == ["hvdtrain: optim.warmup_epochs=0.5 not applied: the task's optimizer SGD runs as the recipe "
                       "built it (optim.schedule=hvdtrain applies hvdtrain's schedule to it)"]


def test_hvdtrains_schedule_on_the_tasks_optimizer_when_asked(tmp_path, own_recipe):
    adapter = run(tmp_path, "optim.schedule=hvdtrain", "optim.decay=linear")
    assert adapter.applied_lrs[0] == 0.05  # the optimizer's own LR is the base (world size 1)
    assert adapter.applied_lrs[-1] < 0.01  # ... and it decays
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())["optim"]
    assert saved["schedule"] == "hvdtrain" and saved["lr"] == 0.05


def test_hvdtrains_schedule_is_refused_beside_the_tasks_scheduler(tmp_path, own_recipe):
    own_recipe(max_lr=0.2)
    with pytest.raises(ConfigError, match="^optim.schedule=hvdtrain: the task brings its own LR schedule"):
        run(tmp_path, "optim.schedule=hvdtrain")


def test_the_tasks_scheduler_is_refused_in_elastic_mode(tmp_path, own_recipe):
    own_recipe(max_lr=0.2)
    with pytest.raises(ConfigError, match="^train.elastic=true: the task's LR scheduler"):
        run(tmp_path, "train.elastic=true")
