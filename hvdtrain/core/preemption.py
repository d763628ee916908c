"""Stopping cleanly when the cluster asks: a signal becomes a step checkpoint and exit code 75.

Schedulers warn a job before they end it: Slurm sends ``--signal=USR1@<seconds>`` before a time
limit and SIGTERM on preemption (then SIGKILL after its ``KillWait``), Kubernetes sends SIGTERM on
eviction (then SIGKILL after the pod's grace period). A signal reaches some ranks, not always all,
and at any moment, in the middle of a collective as often as not.

:class:`PreemptionWatch` catches the signals named by ``checkpoint.preempt_signals`` on every rank
and only records them. At optimizer-step boundaries the ranks agree, in one small allreduce,
whether any of them got one (:meth:`PreemptionWatch.agreed`), so all take the same decision at the
same step and none waits in a collective the others have left. They agree about once a second of
training (:data:`AGREE_EVERY_SECONDS`), not at every step: the allreduce carries each rank's seconds
since the last agreement too, and every rank derives the number of steps to the next one from the
summed values, so all ranks agree at the same steps without another word. An allreduce at every
step cost 3-8% of a small model's step at 2 ranks (one more synchronisation per step; row 1 of
BENCHMARKS.md). A single process agrees with itself at every step, for free. The loop then writes a step
checkpoint (the same kind ``checkpoint.every_steps`` writes: it resumes bitwise) and raises
:class:`Preempted` (:meth:`PreemptionWatch.maybe_stop`, :meth:`PreemptionWatch.at_epoch_end`: the
watch decides its own cadence, as the checkpoint policy does); the command line exits with :data:`EXIT_PREEMPTED` (75, ``EX_TEMPFAIL``: "try
again") so that a job controller that restarts failed pods restarts it, and a requeued Slurm job
or a restarted pod continues with ``checkpoint.resume=auto``. 75 means this stop only: a stall
(:data:`hvdtrain.core.watchdog.STALL_EXIT_CODE`, 70) and every other failure exit otherwise, so
a job script that requeues on 75 never requeues a run that stopped at no checkpoint. A second
SIGTERM or SIGINT on a rank that is already stopping takes the signal's default action at once
(a user's second Ctrl-C).

Nothing is installed where Python allows no handlers (a thread other than the main one) or in an
elastic run, whose driver stops and replaces workers with signals of its own.

A warning can come before the watch exists: Slurm's ``--signal=USR1@<seconds>`` may arrive while a
job still imports its framework, and USR1's default action ends the process. The command line
therefore holds the warning signals (:data:`EARLY_SIGNALS`) from its first line
(:func:`hold_early_warnings`); the watch takes over what was held when it starts, as if the signal
had come then, and a held signal the run does not watch (not in ``checkpoint.preempt_signals``, or
an elastic run) gets its default action at that moment, as it would have without hvdtrain.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from hvdtrain.core.config import preempt_signal_names
from hvdtrain.core.rank0 import RankZeroGate

#: Warning signals whose default action (ending the process) is held from the command line's start
#: until a :class:`PreemptionWatch` takes them over (:func:`hold_early_warnings`).
EARLY_SIGNALS = ("USR1", "USR2")
_held: list[str] = []  # early signals received before a watch took over, in order

#: EX_TEMPFAIL: the job stopped on request at a checkpoint and can continue where it stopped (this
#: stop's code only: a job script requeues on it; a stall exits watchdog.STALL_EXIT_CODE)
EXIT_PREEMPTED = 75
IMMEDIATE_ON_REPEAT = ("TERM", "INT")  # a second one means "now"

#: Seconds of training between two agreements of the ranks (a stop begins at most about this late).
AGREE_EVERY_SECONDS = 1.0
MAX_STEPS_BETWEEN_AGREEMENTS = 1000


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
        self._every, self._steps, self._since = 1, 0, time.monotonic()  # the first step agrees

    @property
    def enabled(self) -> bool:
        """Whether signals are being watched (the per-step agreement runs only then)."""
        return bool(self._previous)

    def __enter__(self) -> "PreemptionWatch":
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in self.names:
            number = getattr(signal, f"SIG{name}")
            previous = signal.signal(number, self._handle)
            self._previous[number] = signal.SIG_DFL if previous is _hold else previous
        held, _held[:] = list(_held), []
        for name in EARLY_SIGNALS:
            number = getattr(signal, f"SIG{name}")
            if name in self.names:
                if name in held:
                    self._handle(number, None)  # it came before the watch: heard now
            elif signal.getsignal(number) is _hold:
                signal.signal(number, signal.SIG_DFL)  # not watched: its own action, now if it came
                if name in held:
                    signal.raise_signal(number)
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
                  f"within about a second, at an optimizer step", file=sys.stderr, flush=True)

    def agreed(self, adapter: Any, size: int, at_step: bool = True) -> list[str]:
        """The signals any rank has received; empty: carry on. While :attr:`enabled` and ``size``
        > 1, a collective on every rank when it is due: at a step (``at_step``) once the steps
        since the last agreement reach the cadence every rank derived from that agreement's sums;
        always at an epoch's end. Between agreements: empty."""
        if not self.enabled:
            return []
        if size == 1:
            return [name for name in self.names if name in self.received]
        if at_step:
            self._steps += 1
            if self._steps < self._every:
                return []
        now = time.monotonic()
        values = {name: float(name in self.received) for name in self.names}
        sums = adapter.allreduce_sums({**values, "_seconds": now - self._since})  # distributed
        if at_step:  # an epoch's end (evaluation, checkpoint) says nothing about a step's time
            per_step = sums["_seconds"] / size / self._steps
            every = int(AGREE_EVERY_SECONDS / per_step) if per_step > 0 else MAX_STEPS_BETWEEN_AGREEMENTS
            self._every = max(1, min(MAX_STEPS_BETWEEN_AGREEMENTS, every))
        self._steps, self._since = 0, now
        return [name for name in self.names if sums[name] > 0]

    def maybe_stop(self, checkpoints: Any, ctx: Any, position: Any, stats: Any, applied: bool,
                   last_in_epoch: bool, saved: bool) -> None:
        """After a micro-batch: at an optimizer-step boundary other than the epoch's last (whose
        signal is heard after the epoch's checkpoint), :meth:`stop_if_signalled` with the epoch's
        running ``stats``; ``saved``: a step checkpoint was just written there."""
        if applied and not last_in_epoch:
            self.stop_if_signalled(checkpoints, ctx, position, stats, saved)

    def at_epoch_end(self, checkpoints: Any, ctx: Any, position: Any, more_epochs: bool) -> None:
        """After an epoch's checkpoint, when the run goes on (after the last epoch it simply ends):
        :meth:`stop_if_signalled` at ``position`` (the next epoch's start), the epoch checkpoint
        being the one to resume from."""
        if more_epochs:
            self.stop_if_signalled(checkpoints, ctx, position, None, saved=True)

    def stop_if_signalled(self, checkpoints: Any, ctx: Any, position: Any, stats: Any, saved: bool) -> None:
        """At an optimizer-step boundary (``stats``: the epoch's running
        :class:`~hvdtrain.core.results.EpochStats`, whose partial totals the checkpoint keeps, read
        only when stopping) or an epoch's end (None): when any rank got a signal, every rank writes
        a step checkpoint here through ``checkpoints`` (the
        :class:`~hvdtrain.core.saving.CheckpointPolicy`; unless ``saved``: one was just written) and
        raises :class:`Preempted` (a collective while :attr:`enabled`)."""
        adapter, config = checkpoints.adapter, checkpoints.config
        signals = self.agreed(adapter, ctx.size, at_step=stats is not None)  # distributed
        if not signals:
            return
        checkpoint, totals = None, stats.totals() if stats is not None else None
        if config.checkpoint.enabled:
            name = f"step-{position.step:08d}" if totals is not None else f"epoch-{position.epoch:04d}"
            if not saved:
                checkpoints.save(ctx, name, position, totals, None)
                # distributed: no rank exits before rank 0 has written it (a launcher such as
                # horovodrun ends the other workers as soon as one exits non-zero)
                adapter.barrier()
            checkpoint = str(checkpoints.manager.directory / name)
        message = stop_message(signals, position.step, position.epoch if totals is not None else position.epoch - 1,
                               checkpoint)
        RankZeroGate(ctx.rank).print(f"hvdtrain: {message}")
        raise Preempted(message, signals, checkpoint)


def hold_early_warnings() -> None:
    """Hold :data:`EARLY_SIGNALS` (where their action is still the default one) until a
    :class:`PreemptionWatch` takes them over: called first by the command line (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for name in EARLY_SIGNALS:
        number = getattr(signal, f"SIG{name}")
        if signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, _hold)


def _hold(number: int, frame: Any) -> None:
    """Record an early warning signal (see :func:`hold_early_warnings`)."""
    name = signal.Signals(number).name.removeprefix("SIG")
    if name not in _held:
        _held.append(name)


AGAIN = "the same command with --resume auto continues from there"  # the command line's way back


def stop_message(signals: list[str], step: int, epoch: int, checkpoint: str | None, again: str = AGAIN) -> str:
    """What rank 0 prints when the job stops on a signal (``again``: how to continue)."""
    got = ", ".join(f"SIG{s}" for s in signals)
    saved = f"saved step checkpoint {checkpoint}" if checkpoint else "no checkpoint written (checkpoint.enabled=false)"
    return (f"{got} received: stopped every rank after optimizer step {step} (epoch {epoch + 1}); {saved}; {again} "
            f"(exit {EXIT_PREEMPTED})")
