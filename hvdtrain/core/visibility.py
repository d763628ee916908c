"""The callbacks every run gets: the experiment trackers of ``log.trackers`` (TensorBoard by
default; MLflow, W&B) and the progress bar (unless the config turns them off), the
``train.log_every`` line, the recipe's export, and the watchdog around fault injection.

:func:`default_callbacks` is what a :class:`~hvdtrain.core.loop.Trainer` adds before the caller's
callbacks; :func:`run_callbacks` wraps those in the ones a run needs once its watchdog and task
exist, in the order they run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from hvdtrain.core.callbacks import Callback, CallbackList
from hvdtrain.core.faults import FaultInjection
from hvdtrain.observability.progress import ProgressBar
from hvdtrain.observability.tensorboard_log import TensorBoardCallback
from hvdtrain.observability.trackers import REMOTE_TRACKERS, TrackersCallback, parse_trackers, preflight
from hvdtrain.core.watchdog import StallWatchdog, WatchdogCallback


def default_callbacks(config: Any) -> list[Callback]:
    """``log.trackers``: ``tensorboard`` -> :class:`TensorBoardCallback` (``train.tensorboard=false``,
    its older switch, still turns it off), ``mlflow``/``wandb`` -> one :class:`TrackersCallback`;
    ``train.progress_bar`` -> :class:`ProgressBar`."""
    callbacks: list[Callback] = []
    trackers = parse_trackers(config.log.trackers)
    if "tensorboard" in trackers and config.train.tensorboard:
        callbacks.append(TensorBoardCallback())
    if any(name in REMOTE_TRACKERS for name in trackers):
        callbacks.append(TrackersCallback(config))
    if config.train.progress_bar:
        callbacks.append(ProgressBar())
    return callbacks


def check_trackers(config: Any, adapter: Any, ctx: Any) -> None:
    """Every rank, right after Horovod starts (a collective unless elastic): rank 0 reaches the
    trackers of ``log.trackers`` (MLflow's server, W&B's login) and all ranks raise the same
    one-line :class:`~hvdtrain.observability.trackers.TrackerError` if one cannot be used."""
    preflight(config, adapter, ctx)


class StepLog(Callback):
    """Rank 0 prints a progress line every ``train.log_every`` micro-batches (0: never). It runs
    after the other callbacks: the progress bar has cleared its line by then."""

    def __init__(self, config: Any):
        self.epochs, self.every = config.train.epochs, config.train.log_every
        self.main = False

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        self.main = ctx.is_main

    def on_step_end(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        if self.main and self.every and (step + 1) % self.every == 0:
            print(f"epoch {epoch + 1}/{self.epochs} step {step + 1}/{logs['steps']} loss {logs['loss']:.4f} "
                  f"lr {logs['lr']:.4g} {logs['samples_per_sec']:.0f} samples/s", flush=True)


class ExportModel(Callback):
    """Rank 0 calls the recipe's ``export(output)`` when training ends (before the other callbacks
    close), if the recipe has one."""

    def __init__(self, export: Callable[[Path], Any] | None, output: Path):
        self.export, self.output, self.main = export, output, False

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        self.main = ctx.is_main

    def on_train_end(self, result: Any) -> None:
        if self.export is not None and self.main:
            self.export(self.output)


def run_callbacks(config: Any, watchdog: StallWatchdog, export: Callable[[Path], Any] | None, output: Path,
                  callbacks: Callback) -> CallbackList:
    """One run's callbacks in order: the watchdog's beats around fault injection, the export,
    ``callbacks`` (the defaults and the caller's), the ``train.log_every`` line."""
    return CallbackList([WatchdogCallback(watchdog, FaultInjection()), ExportModel(export, output), callbacks,
                         StepLog(config)])
