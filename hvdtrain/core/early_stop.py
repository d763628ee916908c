"""Early stopping that every rank decides alike: ``train.early_stopping`` (patience in epochs).

The decision is taken once per epoch, on every rank, from the epoch's ``metrics.jsonl`` record:
``train_loss`` and the ``val_*`` metrics in it are computed from allreduced sums, so every rank
holds the same numbers and reaches the same decision without a collective of its own (a Keras
``EarlyStopping`` on rank 0 alone leaves the other ranks waiting in the next allreduce). Only
those metrics can be watched (:data:`AGREED`): ``samples_per_sec``, ``epoch_time_sec`` and the
others differ between ranks or mean nothing for stopping.

The state (best value, its epoch, epochs without improvement, whether the run stopped) is written
into every record as ``early_stopping`` (a dict: numeric-only readers such as TensorBoard and
``hvdtrain report`` skip it), so it travels with what already survives a kill: the history that a
resume reads back from ``metrics.jsonl`` and the checkpoint's manifest, and the history an elastic
commit holds. :meth:`EarlyStopping.restore` takes it from the last record (or replays the rows when
the watched metric, direction or minimum change differ from the saved ones); patience is applied
afresh, so raising ``train.early_stopping`` lets a stopped run train on deliberately.

Which way is better: ``train.early_stopping_mode``; unset, ``checkpoint.best_mode`` when the
watched metric is ``checkpoint.best_metric``, else ``min`` for a metric with "loss" in its name and
``max`` for any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hvdtrain.core.config import ConfigError
from hvdtrain.core.errors import TrainingError
from hvdtrain.core.provenance import user_set

# The metrics every rank agrees on (computed from allreduced values): ``train_loss`` and ``val_*``.
AGREED = "train_loss and the validation metrics (val_loss, val_accuracy, ...)"
RECORD_KEY = "early_stopping"


def is_agreed(metric: str) -> bool:
    """Whether ``metric`` is one every rank computes alike (``train_loss`` or ``val_*``)."""
    return metric == "train_loss" or (metric.startswith("val_") and len(metric) > 4)


@dataclass(frozen=True)
class Settings:
    """What early stopping watches: ``patience`` epochs without an improvement of more than
    ``min_delta`` in ``metric`` (``mode``: ``max`` or ``min`` is better)."""

    patience: int
    metric: str | None
    mode: str
    min_delta: float

    @classmethod
    def of(cls, config: Any) -> "Settings | None":
        """The run's settings, or None when ``train.early_stopping`` is off."""
        train, checkpoint = config.train, config.checkpoint
        if train.early_stopping is None:
            return None
        metric = train.early_stopping_metric or checkpoint.best_metric
        mode = train.early_stopping_mode
        if mode is None:
            if metric == checkpoint.best_metric:
                mode = checkpoint.best_mode
            else:
                mode = "min" if metric and "loss" in metric else "max"
        return cls(int(train.early_stopping), metric, mode, float(train.early_stopping_min_delta))


def validation_refusal(config: Any) -> str | None:
    """Why ``config`` cannot run a task without validation data (``TrainTask.val_data=None``), or
    None: early stopping must watch ``train_loss``, and a best checkpoint set on a validation metric
    has none to rank by."""
    settings = Settings.of(config)
    if settings is not None and settings.metric and settings.metric.startswith("val_"):
        key = "train.early_stopping_metric" if config.train.early_stopping_metric else "checkpoint.best_metric"
        return (f"{key}={settings.metric} (train.early_stopping={settings.patience}): the task has no validation "
                f"data (TrainTask.val_data=None); set train.early_stopping_metric=train_loss or give validation data")
    best = config.checkpoint.best_metric
    if best and best.startswith("val_") and user_set(config, "checkpoint.best_metric"):
        return (f"checkpoint.best_metric={best}: the task has no validation data (TrainTask.val_data=None); set "
                f"checkpoint.best_metric=train_loss (checkpoint.best_mode=min) or give validation data")
    return None


def without_validation(config: Any, manager: Any, gate: Any) -> None:
    """A run whose task has no validation data: refuse what needs it (:func:`validation_refusal`, a
    :class:`~hvdtrain.core.config.ConfigError`), and rank the best checkpoint by ``train_loss``
    when ``checkpoint.best_metric`` is its default (a validation metric), saying so on rank 0."""
    problem = validation_refusal(config)
    if problem:
        raise ConfigError(problem)
    if (manager.best_metric or "").startswith("val_"):
        manager.best_metric, manager.best_mode = "train_loss", "min"
        gate.print("hvdtrain: no validation data (TrainTask.val_data=None): the best checkpoint kept is the one "
                   "with the lowest train_loss")


def config_refusal(config: Any) -> str | None:
    """Why ``config``'s early stopping cannot run (what is known before training), or None: it
    needs a metric, and one that every rank agrees on."""
    settings = Settings.of(config)
    if settings is None:
        return None
    if settings.metric is None:
        return (f"train.early_stopping={settings.patience} needs a metric to watch: set "
                f"train.early_stopping_metric (or checkpoint.best_metric) to {AGREED}")
    if not is_agreed(settings.metric):
        key = "train.early_stopping_metric" if config.train.early_stopping_metric else "checkpoint.best_metric"
        unset = "" if config.train.early_stopping_metric else " (watched while train.early_stopping_metric is unset)"
        return (f"{key}={settings.metric!r}{unset} cannot drive train.early_stopping: it must be a metric every "
                f"worker agrees on, {AGREED}")
    return None


def _allowed(record: dict[str, Any]) -> str:
    return ", ".join(k for k in record if is_agreed(k) and isinstance(record[k], (int, float)))


class EarlyStopping:
    """The early-stop state of one run (the same on every rank; see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.best: float | None = None
        self.best_epoch = 0
        self.wait = 0  # epochs since best_epoch without an improvement
        self.epoch = 0  # the last epoch seen

    @property
    def stopped(self) -> bool:
        """Whether the run has stopped (``patience`` epochs without an improvement)."""
        return self.best is not None and self.wait >= self.settings.patience

    @classmethod
    def restore(cls, settings: Settings, history: list[dict[str, Any]]) -> "EarlyStopping":
        """The state after the epochs in ``history`` (the last record's saved state when it watched
        the same metric, direction and minimum change; else the rows replayed)."""
        stopper = cls(settings)
        saved = history[-1].get(RECORD_KEY) if history else None
        s = settings
        if isinstance(saved, dict) and (saved.get("metric"), saved.get("mode"), saved.get("min_delta")) == \
                (s.metric, s.mode, s.min_delta) and isinstance(saved.get("best"), (int, float)):
            stopper.best, stopper.best_epoch = float(saved["best"]), int(saved["best_epoch"])
            stopper.wait, stopper.epoch = int(saved["epochs_without_improvement"]), int(history[-1]["epoch"])
            return stopper
        for row in history:
            if isinstance(row.get(s.metric), (int, float)):
                stopper._observe(int(row["epoch"]), float(row[s.metric]))
        return stopper

    def missing(self, record: dict[str, Any]) -> str | None:
        """The refusal when ``record`` lacks the watched metric (naming those it has), else None."""
        value = record.get(self.settings.metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        return (f"train.early_stopping_metric={self.settings.metric!r} is not among this run's metrics; "
                f"use one of: {_allowed(record)}")

    def _improves(self, value: float) -> bool:
        if self.best is None:
            return True  # the first epoch sets the mark
        if math.isnan(value):
            return False
        if math.isnan(self.best):
            return True
        if self.settings.mode == "max":
            return value > self.best + self.settings.min_delta
        return value < self.best - self.settings.min_delta

    def _observe(self, epoch: int, value: float) -> None:
        self.epoch = epoch
        if self._improves(value):
            self.best, self.best_epoch, self.wait = value, epoch, 0
        else:
            self.wait += 1

    def update(self, record: dict[str, Any]) -> bool:
        """Take epoch ``record["epoch"]``'s value, write the state into ``record`` (under
        ``early_stopping``) and return whether the run stops after this epoch. A record without
        the metric raises :class:`~hvdtrain.core.errors.TrainingError` (every rank alike)."""
        problem = self.missing(record)
        if problem:
            raise TrainingError(problem)
        self._observe(int(record["epoch"]), float(record[self.settings.metric]))
        record[RECORD_KEY] = self.state()
        return self.stopped

    def state(self) -> dict[str, Any]:
        """The state as saved in a record (JSON-ready); with ``stopped`` and ``reason`` once stopped."""
        s = self.settings
        state: dict[str, Any] = {"metric": s.metric, "mode": s.mode, "min_delta": s.min_delta,
                                 "patience": s.patience, "best": self.best, "best_epoch": self.best_epoch,
                                 "epochs_without_improvement": self.wait, "stopped": self.stopped}
        if self.stopped:
            state["reason"] = self.reason()
        return state

    def reason(self) -> str:
        """Why the run stopped, in one line."""
        s = self.settings
        by = f" by more than {s.min_delta:g}" if s.min_delta else ""
        return (f"{s.metric} has not improved{by} on {self.best:.6g} (epoch {self.best_epoch}, mode {s.mode}) for "
                f"{self.wait} epoch(s) (train.early_stopping={s.patience})")

    def how_to_continue(self) -> str:
        """What a user sets to train past the stop deliberately."""
        return (f"to train on, raise train.early_stopping above {self.wait} or set train.early_stopping=none "
                f"with --resume")


def continue_from(config: Any, history: list[dict[str, Any]], gate: Any) -> EarlyStopping | None:
    """The run's early-stop state after the epochs in ``history`` (None when off): what a resume or
    an elastic re-form continues from. A run that had already stopped trains no further (rank 0
    says so through ``gate``)."""
    settings = Settings.of(config)
    if settings is None:
        return None
    stopper = EarlyStopping.restore(settings, history)
    if stopper.stopped:
        gate.print(f"hvdtrain: the run stopped early after epoch {stopper.epoch}: {stopper.reason()}; "
                   f"nothing left to train ({stopper.how_to_continue()})")
    return stopper


def resume_refusal(config: Any, saved_config: dict[str, Any], history: list[dict[str, Any]]) -> str | None:
    """Rank 0's check of a ``--resume``, before training: a run that stopped early is not trained
    past its stop with more ``train.epochs`` (the same or fewer epochs finish it as they would a
    completed run); a watched metric the history does not hold is refused naming those it has."""
    settings = Settings.of(config)
    if settings is None or not history:
        return None
    stopper = EarlyStopping(settings)
    problem = stopper.missing(history[-1])
    if problem:
        return problem + " (nothing was changed)"
    stopper = EarlyStopping.restore(settings, history)
    saved_epochs = (saved_config.get("train") or {}).get("epochs")
    if stopper.stopped and isinstance(saved_epochs, int) and config.train.epochs > saved_epochs:
        return (f"cannot resume with train.epochs={config.train.epochs}: the run stopped early after epoch "
                f"{stopper.epoch} ({stopper.reason()}); {stopper.how_to_continue()} (nothing was changed)")
    return None
