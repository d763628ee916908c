"""Turn a stuck job into a prompt, clear error instead of a silent hang.

When one rank stops calling collectives (it hangs in user code, or skipped a step), the other
ranks wait forever in the next allreduce; Horovod 0.28's stall inspector does not report this
under the Gloo controller. :class:`StallWatchdog` is a daemon thread on every rank: the training
loop reports progress (``beat``) and whether the rank is about to wait in collectives
(``phase``). If no progress is made for ``timeout`` seconds, every rank prints what it was doing
(``waiting in collectives`` for the ranks that arrived, anything else for the ranks that did not)
and exits, so the launcher tears the job down. :class:`WatchdogCallback` reports the training
steps' progress; the loop beats directly around evaluation, checkpoints and start-up.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from hvdtrain.core.callbacks import Callback

STALL_EXIT_CODE = 75


class StallWatchdog:
    """Exit this process if the training loop makes no progress for ``timeout`` seconds."""

    def __init__(self, timeout: float | None, rank: int):
        self.timeout, self.rank = timeout, rank
        self.step, self.where = 0, "starting"
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "StallWatchdog":
        if self.timeout:
            self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def beat(self, step: int, where: str) -> None:
        """Progress: the loop is at optimizer ``step`` and about to do ``where``."""
        self.step, self.where, self._last = step, where, time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self._last
            if idle > self.timeout:
                arrived = self.where.startswith("waiting in collectives")
                print(f"hvdtrain: error: rank {self.rank}: no progress for {idle:.0f}s "
                      f"(train.stall_timeout_sec={self.timeout:g}) at optimizer step {self.step}, {self.where}"
                      + ("" if arrived else f" -- rank {self.rank} did not arrive at the collective"),
                      file=sys.stderr, flush=True)
                # Give the launcher time to forward the message; a rank that did arrive waits longer,
                # so the report of the rank that did not is the one the launcher names.
                time.sleep(3.0 if arrived else 1.0)
                os._exit(STALL_EXIT_CODE)


class WatchdogCallback(Callback):
    """Beats ``watchdog`` around each micro-batch: the step's user code (``inner``'s
    ``on_step_begin`` runs then, e.g. fault injection), the train step's collectives, the next
    batch's loading."""

    def __init__(self, watchdog: StallWatchdog, inner: Callback | None = None):
        self.watchdog, self.inner = watchdog, inner or Callback()

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        self.inner.on_train_begin(ctx, info)

    def on_step_begin(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        self.watchdog.beat(logs["global_step"], "running the training step's user code")
        self.inner.on_step_begin(epoch, step, logs)
        self.watchdog.beat(logs["global_step"], "waiting in collectives (gradient allreduce)")

    def on_step_end(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        self.watchdog.beat(logs["global_step"], "loading the next batch")
        self.inner.on_step_end(epoch, step, logs)

    def on_epoch_end(self, epoch: int, record: dict[str, Any]) -> None:
        self.inner.on_epoch_end(epoch, record)

    def on_train_end(self, result: Any) -> None:
        self.inner.on_train_end(result)
