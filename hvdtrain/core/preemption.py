"""Stopping cleanly when the cluster asks: a signal becomes a step checkpoint and exit code 75.

Schedulers warn a job before they end it: Slurm sends ``--signal=USR1@<seconds>`` before a time
limit and SIGTERM on preemption (then SIGKILL after its ``KillWait``), Kubernetes sends SIGTERM on
eviction (then SIGKILL after the pod's grace period). A signal reaches some ranks, not always all,
and at any moment, in the middle of a collective as often as not.

:class:`PreemptionWatch` catches the signals named by ``checkpoint.preempt_signals`` on every rank
and only records them. At each optimizer-step boundary the ranks agree, in one small allreduce,
whether any of them got one (:meth:`PreemptionWatch.agreed`), so all take the same decision at the
same step and none waits in a collective the others have left. The loop then writes a step
checkpoint (the same kind ``checkpoint.every_steps`` writes: it resumes bitwise) and raises
:class:`Preempted`; the command line exits with :data:`EXIT_PREEMPTED` (75, ``EX_TEMPFAIL``: "try
again") so that a job controller that restarts failed pods restarts it, and a requeued Slurm job
or a restarted pod continues with ``checkpoint.resume=auto``. A second SIGTERM or SIGINT on a rank
that is already stopping takes the signal's default action at once (a user's second Ctrl-C).

Nothing is installed where Python allows no handlers (a thread other than the main one) or in an
elastic run, whose driver stops and replaces workers with signals of its own.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from hvdtrain.core.config import preempt_signal_names

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the job stopped on request and can continue where it stopped
IMMEDIATE_ON_REPEAT = ("TERM", "INT")  # a second one means "now"


class Preempted(Exception):
    """Every rank stopped at an agreed step after a signal; ``checkpoint`` is the step checkpoint
    written there (None with checkpoints off)."""

    def __init__(self, message: str, signals: list[str], checkpoint: str | None):
        super().__init__(message)
        self.signals, self.checkpoint = signals, checkpoint


class PreemptionWatch:
    """The signals of ``checkpoint.preempt_signals`` recorded on this rank while the context is
    entered (previous handlers restored at exit). ``enabled`` False (an elastic run, or no names)
    installs nothing and :meth:`agreed` is never a collective."""

    def __init__(self, names: str | None, rank: int, enabled: bool = True):
        self.names = preempt_signal_names(names) if enabled else []
        self.rank = rank
        self.received: list[str] = []
        self._previous: dict[int, Any] = {}

    @property
    def enabled(self) -> bool:
        """Whether signals are being watched (the per-step agreement runs only then)."""
        return bool(self._previous)

    def __enter__(self) -> "PreemptionWatch":
        if self.names and threading.current_thread() is threading.main_thread():
            for name in self.names:
                number = getattr(signal, f"SIG{name}")
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame: Any) -> None:
        name = signal.Signals(number).name.removeprefix("SIG")
        if name in self.received and name in IMMEDIATE_ON_REPEAT:
            signal.signal(number, signal.SIG_DFL)  # a second TERM/INT: stop now, as without hvdtrain
            signal.raise_signal(number)
            return
        if name not in self.received:
            self.received.append(name)
            print(f"hvdtrain: rank {self.rank}: SIG{name} received: every rank saves a step checkpoint and stops "
                  f"at the next optimizer step", file=sys.stderr, flush=True)

    def agreed(self, adapter: Any) -> list[str]:
        """The signals any rank has received (a collective on every rank, each optimizer step while
        :attr:`enabled`); empty: carry on."""
        if not self.enabled:
            return []
        sums = adapter.allreduce_sums({name: float(name in self.received) for name in self.names})  # distributed
        return [name for name in self.names if sums[name] > 0]


def stop_message(signals: list[str], step: int, epoch: int, checkpoint: str | None) -> str:
    """What rank 0 prints when the job stops on a signal."""
    got = ", ".join(f"SIG{s}" for s in signals)
    saved = f"saved step checkpoint {checkpoint}" if checkpoint else "no checkpoint written (checkpoint.enabled=false)"
    return (f"{got} received: stopped every rank after optimizer step {step} (epoch {epoch + 1}); {saved}; the same "
            f"command with --resume auto continues from there (exit {EXIT_PREEMPTED})")
