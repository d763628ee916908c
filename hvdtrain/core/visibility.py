"""The callbacks the core gives every run: the ``train.log_every`` line, the recipe's export,
and the watchdog around fault injection.

:func:`run_callbacks` wraps the Trainer's callbacks (those the caller gave; ``hvdtrain.Trainer``
adds the progress bar and the trackers of ``log.trackers``: :mod:`hvdtrain.trainer`) in the ones a
run needs once its watchdog and task exist, in the order they run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from hvdtrain.core.callbacks import Callback, CallbackList
from hvdtrain.core.faults import FaultInjection
from hvdtrain.core.watchdog import StallWatchdog, WatchdogCallback


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
