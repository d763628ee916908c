"""Fault injection for hvdtrain's own reliability tests (and for users who want to see a failure).

Set ``HVDTRAIN_FAULT`` to one or more comma-separated faults, ``KIND[:rank=R][:step=S][:ms=M][:size=N]``
(``size=N``: only while the job has N workers, e.g. a survivor slowed only until the lost host rejoins):

* ``raise``  raise an exception on rank R before global step S;
* ``kill``   ``kill -9`` this worker (SIGKILL to itself) before step S;
* ``hang``   sleep forever before step S (a rank that never reaches the next collective);
* ``slow``   sleep ``ms`` milliseconds (default 100) before every step from step S on: a straggler,
  or a survivor kept busy long enough for an elastic host to come back;
* ``nan``    make rank R's gradient NaN at step S (its loss is weighted by NaN);
* ``crash-in-checkpoint``  exit abruptly after a checkpoint's files are written, before the
  rename that publishes it (step S: the first checkpoint at or after that step);
* ``kill-at-sync``  ``kill -9`` this worker as it enters its first elastic state sync (where the
  start is agreed), if it is rank R then: a worker lost before the job's first sync.

Without the variable every function here is a no-op. The training loop fires them through the
:class:`FaultInjection` callback, before each micro-batch's train step. The variable is read when a
run starts (or at the first fault check), not when this module is imported: a value that is not
of this form stops the run with one line naming ``HVDTRAIN_FAULT`` and the forms allowed, and a
command that runs no training ignores it.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from hvdtrain.core.callbacks import Callback

KINDS = ("raise", "kill", "hang", "slow", "nan", "crash-in-checkpoint", "kill-at-sync")
FIELDS = ("rank", "step", "ms", "size")


class InjectedFault(RuntimeError):
    """The exception the ``raise`` fault throws."""


@dataclass(frozen=True)
class Fault:
    """One fault: what, on which rank (None: all), at which global step (None: any; ``slow``: from
    that step on), for ``slow`` how long each step is delayed, and in a job of how many workers
    (None: any)."""

    kind: str
    rank: int | None = None
    step: int | None = None
    ms: int = 100
    size: int | None = None

    def matches(self, kind: str, rank: int, step: int, size: int | None = None) -> bool:
        """True if this fault fires for ``kind`` on ``rank`` at ``step`` in a job of ``size`` workers
        (None: the size is not known here, so ``size=`` does not filter)."""
        if self.kind != kind or self.rank not in (None, rank):
            return False
        if self.size is not None and size is not None and size != self.size:
            return False
        if self.step is None:
            return True
        return step >= self.step if kind == "slow" else step == self.step


VARIABLE = "HVDTRAIN_FAULT"
FORM = "KIND[:rank=N][:step=N][:ms=N][:size=N], comma-separated"


def parse_faults(text: str | None) -> list[Fault]:
    """Parse the ``HVDTRAIN_FAULT`` syntax; an unknown kind or field is a one-line ValueError
    naming the variable, the bad part and the allowed forms."""
    faults = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        kind, *fields = item.split(":")
        if kind not in KINDS:
            raise ValueError(f"{VARIABLE}: unknown fault {kind[:80]!r}; use {FORM}, KIND one of: {', '.join(KINDS)}")
        values: dict[str, int] = {}
        for field in fields:
            key, _, value = field.partition("=")
            if key not in FIELDS or not value.isdigit() or len(value) > 18:
                raise ValueError(f"{VARIABLE}: bad field {field[:80]!r} in {item[:120]!r}; use {FORM} "
                                 f"(rank=N, step=N, ms=N or size=N)")
            values[key] = int(value)
        faults.append(Fault(kind, **values))
    return faults


# Read at first use (a run's start, FaultInjection.on_train_begin), never at import: a bad value is
# then the run's one-line error, and commands that inject no faults (hvdtrain recipes) never read it.
_FAULTS: list[Fault] | None = None


def load_faults() -> None:
    """Read ``HVDTRAIN_FAULT`` again (a run started in-process after the variable was set); a bad
    value is a one-line ValueError naming it (:func:`parse_faults`)."""
    global _FAULTS
    _FAULTS = parse_faults(os.environ.get(VARIABLE))


def _faults() -> list[Fault]:
    """The faults set, read from ``HVDTRAIN_FAULT`` at the first use."""
    if _FAULTS is None:
        load_faults()
    return _FAULTS or []


def active(kind: str, rank: int, step: int, size: int | None = None) -> bool:
    """True if a fault of ``kind`` is set for this rank and step (in a job of ``size`` workers)."""
    return any(f.matches(kind, rank, step, size) for f in _faults())


def before_step(rank: int, step: int, size: int | None = None) -> None:
    """Fire ``raise``, ``kill``, ``hang`` or ``slow`` faults due before global step ``step``."""
    for fault in _faults():
        if fault.matches("slow", rank, step, size):
            time.sleep(fault.ms / 1000)
    if active("raise", rank, step, size):
        raise InjectedFault(f"injected failure on rank {rank} at step {step} (HVDTRAIN_FAULT)")
    if active("kill", rank, step, size):
        os.kill(os.getpid(), signal.SIGKILL)
    if active("hang", rank, step, size):
        while True:
            time.sleep(3600)


def crash_before_publish(step: int) -> None:
    """Exit at once, leaving a checkpoint written but not renamed into place."""
    if any(f.kind == "crash-in-checkpoint" and (f.step is None or step >= f.step) for f in _faults()):
        os._exit(17)


_synced = False


def at_first_sync(rank: int) -> None:
    """Fire ``kill-at-sync`` (rank ``rank`` now) when this process enters its first elastic sync."""
    global _synced
    first, _synced = not _synced, True
    if first and any(f.kind == "kill-at-sync" and f.rank in (None, rank) for f in _faults()):
        os.kill(os.getpid(), signal.SIGKILL)


class FaultInjection(Callback):
    """Fires the faults due before each micro-batch's train step on this rank: ``raise``, ``kill``,
    ``hang`` and ``slow`` (:func:`before_step`), and ``nan``, which poisons the step's loss weight
    so its gradients are NaN whatever the inputs' dtype."""

    rank = 0
    size: int | None = None

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        load_faults()  # the variable as it is when training starts, not when this module was imported
        # again after an elastic re-form: faults name the rank and world size of the moment
        self.rank, self.size = ctx.rank, ctx.size

    def on_step_begin(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        before_step(self.rank, logs["global_step"], self.size)
        if active("nan", self.rank, logs["global_step"], self.size):
            logs["weight"] = float("nan")
