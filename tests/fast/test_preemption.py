"""Preemption in-process: a signal becomes a step checkpoint at the next optimizer step and
:class:`Preempted`; ``checkpoint.resume=auto`` continues it bitwise, starts on an unused output
and refuses another run's. (Several ranks agreeing, with the signal on one rank only, is
tests/distributed/test_preemption.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from test_kill_and_resume import assert_same_checkpoint
from toyrun import fit, snapshot_tree, without_timing

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.config import ConfigError
from hvdtrain.core.loop import TrainingError
from hvdtrain.core import preemption
from hvdtrain.core.preemption import EXIT_PREEMPTED, PreemptionWatch, Preempted

pytestmark = pytest.mark.resume


class SignalAt(Callback):
    """Sends this process ``signum`` once the run reaches optimizer step ``step`` (as a scheduler would, mid-run)."""

    def __init__(self, step: int, signum: int = signal.SIGUSR1) -> None:
        self.step, self.signum, self.sent = step, signum, False

    def on_step_end(self, epoch, step, logs):
        if logs["global_step"] == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


# The toy run: 12 optimizer steps per epoch (one per batch), 2 epochs.
@pytest.mark.parametrize("stop_at, signum, checkpoint, accumulation", [
    (7, signal.SIGUSR1, "step-00000007", 1),   # mid-epoch: a step checkpoint at the next boundary
    (12, signal.SIGTERM, "epoch-0001", 1),     # the epoch's last step: heard after the epoch checkpoint
    (5, signal.SIGUSR1, "step-00000005", 2),   # with accumulation: at an optimizer step, not a micro-batch
])
def test_a_signal_stops_at_the_next_step_with_a_checkpoint_and_auto_resume_is_exact(tmp_path, stop_at, signum,
                                                                                     checkpoint, accumulation):
    overrides = ("train.epochs=2", "checkpoint.keep_last=100", f"train.grad_accumulation={accumulation}")
    reference = fit(tmp_path / "reference", *overrides)
    before = signal.getsignal(signum)
    with pytest.raises(Preempted) as stopped:
        fit(tmp_path / "run", *overrides, "checkpoint.resume=auto", callbacks=[SignalAt(stop_at, signum)])
    assert signal.getsignal(signum) is before  # handlers restored
    name = signal.Signals(signum).name
    assert stopped.value.signals == [name.removeprefix("SIG")]
    assert stopped.value.checkpoint == str(tmp_path / "run" / "checkpoints" / checkpoint)
    assert (tmp_path / "run" / "checkpoints" / checkpoint / "manifest.json").is_file()
    assert f"{name} received" in str(stopped.value) and "--resume auto" in str(stopped.value)

    resumed = fit(tmp_path / "run", *overrides, "checkpoint.resume=auto")  # the requeued job: the same command
    assert resumed.result.checkpoint.name == "epoch-0002"
    assert_same_checkpoint(resumed.checkpoints / "epoch-0002", reference.checkpoints / "epoch-0002")
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())


def test_a_signal_after_the_last_epoch_lets_the_run_finish(tmp_path):
    run = fit(tmp_path, "train.epochs=1", callbacks=[SignalAt(12)])
    assert run.result.checkpoint.name == "epoch-0001" and len(run.metrics()) == 1


def test_no_signals_watched_leaves_the_handlers_alone(tmp_path):
    before = signal.getsignal(signal.SIGUSR1)
    watch = PreemptionWatch("none", rank=0)
    with watch:
        assert signal.getsignal(signal.SIGUSR1) is before and not watch.enabled
    with PreemptionWatch("USR1,TERM", rank=0, enabled=False) as elastic:  # an elastic run
        assert not elastic.enabled and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert elastic.agreed(adapter=None, size=2) == []  # no collective


def test_unknown_signal_names_are_refused_naming_the_allowed_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"'KILL' is not a signal .* USR1, USR2, TERM"):
        fit(tmp_path, "checkpoint.preempt_signals=USR1,KILL")


def test_a_warning_before_the_run_started_stops_it_at_its_first_step(tmp_path):
    """Slurm's --signal=USR1@N can come while the job still imports its framework: the command line
    holds it (hold_early_warnings) and the run hears it as soon as its watch starts."""
    try:
        preemption.hold_early_warnings()
        os.kill(os.getpid(), signal.SIGUSR1)  # during "start-up": held, not fatal
        assert preemption._held == ["USR1"]
        with pytest.raises(Preempted) as stopped:
            fit(tmp_path / "run", "train.epochs=2", "checkpoint.resume=auto")
        assert stopped.value.signals == ["USR1"]
        assert stopped.value.checkpoint == str(tmp_path / "run" / "checkpoints" / "step-00000001")
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the watch gave back the default action
        assert preemption._held == []
    finally:
        preemption._held.clear()
        for number in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_DFL)


def test_a_held_warning_the_run_does_not_watch_takes_its_default_action_when_the_run_starts():
    code = ("import os, signal\n"
            "from hvdtrain.core.preemption import PreemptionWatch, hold_early_warnings\n"
            "hold_early_warnings()\n"
            "os.kill(os.getpid(), signal.SIGUSR2)\n"
            "print('held', flush=True)\n"
            "with PreemptionWatch('TERM,USR1', rank=0):\n"
            "    print('survived', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGUSR2, (proc.returncode, proc.stdout, proc.stderr)
    assert "held" in proc.stdout and "survived" not in proc.stdout


def test_a_second_term_takes_the_default_action_at_once():
    code = ("import os, signal, time\n"
            "from hvdtrain.core.preemption import PreemptionWatch\n"
            "with PreemptionWatch('TERM', rank=0) as w:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    assert w.received == ['TERM']\n"
            "    print('first recorded', flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(5)\n"
            "print('survived')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stdout, proc.stderr)
    assert "first recorded" in proc.stdout and "survived" not in proc.stdout


def test_auto_resume_starts_on_an_unused_output_and_refuses_another_runs(tmp_path):
    fresh = fit(tmp_path / "run", "train.epochs=1", "checkpoint.resume=auto")
    assert [r["epoch"] for r in fresh.metrics()] == [1]
    before = snapshot_tree(tmp_path / "run")
    with pytest.raises(TrainingError, match=r"resume=auto: .* holds another run: .* train\.seed=42, this run has "
                                            r"train\.seed=7") as refused:
        fit(tmp_path / "run", "train.epochs=2", "checkpoint.resume=auto", "train.seed=7")
    assert "nothing was changed" in str(refused.value)
    assert snapshot_tree(tmp_path / "run") == before
    # the same run, more epochs: continues
    more = fit(tmp_path / "run", "train.epochs=2", "checkpoint.resume=auto")
    assert [r["epoch"] for r in more.metrics()] == [1, 2]


def test_auto_resume_refuses_an_output_without_a_config(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\n')
    with pytest.raises(TrainingError, match=r"no readable config\.yaml"):
        fit(tmp_path, "checkpoint.resume=auto")
    assert (tmp_path / "metrics.jsonl").read_text() == '{"epoch": 1}\n'


def test_the_command_line_exit_code_is_75():
    assert EXIT_PREEMPTED == 75  # EX_TEMPFAIL; tests/distributed/test_preemption.py checks the real exit


def test_ranks_agree_about_once_a_second_and_hear_a_signal_at_the_next_agreement(monkeypatch):
    """The per-step allreduce cost a small model 3-8% of its step at 2 ranks: the ranks agree about
    every AGREE_EVERY_SECONDS instead, each deriving the same cadence from the summed seconds."""
    from hvdtrain.core import preemption
    clock = [0.0]
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    sums = []

    class TwoAlikeRanks:  # what the allreduce of two ranks like this one returns
        def allreduce_sums(self, values):
            sums.append(values)
            return {key: 2 * value for key, value in values.items()}

    with PreemptionWatch("USR1", rank=0) as watch:
        heard = {}
        for step in range(1, 41):
            clock[0] += 0.125  # 125 ms per step: every 8th step
            if step == 20:
                watch.received.append("USR1")
            heard[step] = watch.agreed(TwoAlikeRanks(), size=2)
            if heard[step]:
                break
        at_epoch_end = watch.agreed(TwoAlikeRanks(), size=2, at_step=False)  # always a collective
    # steps 1, 9, 17 and 25 (each a second apart after the first), then the epoch's end
    assert [v["_seconds"] for v in sums] == [0.125, 1.0, 1.0, 1.0, 0.0]
    assert [s for s, h in heard.items() if h] == [25] and heard[25] == ["USR1"]
    assert at_epoch_end == ["USR1"]


def test_a_single_process_hears_a_signal_at_the_very_next_step_without_a_collective():
    with PreemptionWatch("USR1", rank=0) as watch:
        assert watch.agreed(adapter=None, size=1) == []
        watch.received.append("USR1")
        assert watch.agreed(adapter=None, size=1) == ["USR1"]
