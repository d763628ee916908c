"""Turn a stuck job into a prompt, clear error instead of a silent hang.

When one rank stops calling collectives (it hangs in user code, or skipped a step), the other
ranks wait forever in the next allreduce; Horovod 0.28's stall inspector does not report this
under the Gloo controller. :class:`StallWatchdog` is a daemon thread on every rank: the training
loop reports progress (``beat``) and whether the rank is about to wait in collectives
(``phase``). If no progress is made for ``timeout`` seconds, every rank prints what it was doing
(``waiting in collectives`` for the ranks that arrived, anything else for the ranks that did not)
and exits, so the launcher tears the job down. :class:`WatchdogCallback` reports the training
steps' progress; the loop beats directly around evaluation, checkpoints and start-up.

Some phases legitimately make no progress for longer than any step: an elastic join (the job waits
for new workers to start and build their data), a cold image-index or token-cache build, rank 0
verifying the checkpoints' checksums while the others wait for its plan. They announce themselves
with ``with watchdog.phase("building the image index"):`` (:meth:`StallWatchdog.phase`, or the
module-level :func:`phase` on the running watchdog, for code that holds no handle): stall detection
is suspended inside (unless a ``limit`` is given), every message names the phase, and the clock
starts afresh when it ends.

A stall exits :data:`STALL_EXIT_CODE` (70, ``EX_SOFTWARE``): a failure, never the preemption's 75
(:data:`hvdtrain.core.preemption.EXIT_PREEMPTED`, ``EX_TEMPFAIL``), so a job script that requeues
on 75 (``examples/slurm/requeue.sbatch``) does not put a hung run back in the queue: it stopped at
no checkpoint and would hang again.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from hvdtrain.core.callbacks import Callback

#: The exit code of a stall (``EX_SOFTWARE``): a failure. Not 75, the preemption's code, on which a
#: job script requeues the job (a hung run requeued would loop in the queue for ever).
STALL_EXIT_CODE = 70
_ACTIVE: list["StallWatchdog"] = []  # the running watchdog(s) of this process, innermost last


@contextmanager
def phase(what: str, limit: float | None = None) -> Iterator[None]:
    """:meth:`StallWatchdog.phase` on this process's running watchdog; nothing without one (a
    recipe or data code that runs outside the trainer)."""
    if not _ACTIVE:
        yield
        return
    with _ACTIVE[-1].phase(what, limit):
        yield


class StallWatchdog:
    """Exit this process if the training loop makes no progress for ``timeout`` seconds."""

    def __init__(self, timeout: float | None, rank: int):
        self.timeout, self.rank = timeout, rank
        self.step, self.where = 0, "starting"
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._phases: list[tuple[str, float | None]] = []  # announced phases, innermost last

    def __enter__(self) -> "StallWatchdog":
        if self.timeout:
            self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog", daemon=True)
            self._thread.start()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def beat(self, step: int, where: str) -> None:
        """Progress: the loop is at optimizer ``step`` and about to do ``where``."""
        self.step, self.where, self._last = step, where, time.monotonic()

    @contextmanager
    def phase(self, what: str, limit: float | None = None) -> Iterator[None]:
        """A phase that may make no progress for longer than the stall timeout (an elastic join, a
        cold index build, rank 0 verifying checkpoints): stall detection is suspended inside, or
        with ``limit`` seconds uses that instead of the timeout; a message names the phase. The
        clock restarts when the phase ends."""
        self._phases.append((what, limit))
        self._last = time.monotonic()
        try:
            yield
        finally:
            self._phases.remove((what, limit))
            self._last = time.monotonic()

    def _allowed(self) -> tuple[float | None, str]:
        """The idle time allowed now (None: suspended) and where the loop is, phase named."""
        phases = list(self._phases)  # a snapshot: the loop's thread enters and leaves phases
        if not phases:
            return self.timeout, self.where
        what, limit = phases[-1]
        return limit, f"{self.where} (phase: {what})"

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self._last
            allowed, where = self._allowed()
            if allowed is not None and idle > allowed:
                arrived = self.where.startswith("waiting in collectives")
                limit = (f"train.stall_timeout_sec={self.timeout:g}" if allowed == self.timeout and
                         where == self.where else f"the phase's limit of {allowed:g}s")
                print(f"hvdtrain: error: rank {self.rank}: no progress for {idle:.0f}s "
                      f"({limit}) at optimizer step {self.step}, {where}"
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
