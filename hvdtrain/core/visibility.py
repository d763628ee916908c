"""The callbacks the core gives every run: the config's notes, the ``train.log_every`` line, the
recipe's export, and the watchdog around fault injection.

:func:`run_callbacks` wraps the Trainer's callbacks (those the caller gave; ``hvdtrain.Trainer``
adds the progress bar and the trackers of ``log.trackers``: :mod:`hvdtrain.trainer`) in the ones a
run needs once its watchdog and task exist, in the order they run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from hvdtrain.core.callbacks import Callback, CallbackList
from hvdtrain.core.faults import FaultInjection
from hvdtrain.core.watchdog import StallWatchdog, WatchdogCallback


class ConfigNotes(Callback):
    """Rank 0 prints what the config's loader rewrote (``config.notes``: an old key spelling,
    ``train.fp16_allreduce``'s alias; :func:`hvdtrain.core.config.load_config`), once, as the run
    begins: the loader runs on every rank before Horovod says which one is rank 0."""

    def __init__(self, config: Any):
        self.notes = tuple(getattr(config, "notes", ()))

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        if ctx.is_main:
            for note in self.notes:
                print(f"hvdtrain: note: {note}", file=sys.stderr, flush=True)
        self.notes = ()  # once (an elastic reset begins again)


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
    """One run's callbacks in order: the watchdog's beats around fault injection, the config's
    notes, the export, ``callbacks`` (the defaults and the caller's), the ``train.log_every`` line."""
    return CallbackList([WatchdogCallback(watchdog, FaultInjection()), ConfigNotes(config), ExportModel(export, output),
                         callbacks, StepLog(config)])
