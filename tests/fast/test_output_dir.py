"""One run per output directory (issue 22, item 5): a used output is refused without --resume, a
run in progress holds the directory's lock, and a torn ``metrics.jsonl`` tail does not stop a
resume (item 7). In-process, on the NumPy adapter; a lock held by another process, and one left
by a killed process, are in ``tests/reliability/test_output_safety.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from envguard import isolate_environ
from numpy_adapter import N_TRAIN, NumpyAdapter, register_toy_recipe
from toyrun import Interrupt, StopAt, fit, snapshot_tree, without_timing

from hvdtrain.core.loop import TrainingError

pytestmark = pytest.mark.resume


def test_a_used_output_without_checkpoints_is_refused_naming_what_is_there(tmp_path):
    """Checkpoints off: the second run used to append to the first one's metrics.jsonl and replace
    its config.yaml."""
    fit(tmp_path, "train.epochs=1", "checkpoint.enabled=false")
    before = snapshot_tree(tmp_path)
    with pytest.raises(TrainingError, match="--resume") as refused:
        fit(tmp_path, "train.epochs=2", "checkpoint.enabled=false")
    message = str(refused.value)
    assert "metrics.jsonl" in message and "config.yaml" in message and "nothing was changed" in message
    assert snapshot_tree(tmp_path) == before


class SecondRunWhileSaving(NumpyAdapter):
    """Starts another run into the same output while its first checkpoint is being written (the
    folder ``.tmp-epoch-0001-PID`` exists, unpublished), and keeps what that run raised."""

    def __init__(self, output):
        super().__init__()
        self.output, self.refusal = output, None

    def save_state(self, directory):
        if self.refusal is None:
            try:
                fit(self.output, "train.epochs=1")
                self.refusal = "the second run was not refused"
            except TrainingError as exc:
                self.refusal = str(exc)
        super().save_state(directory)


def test_a_second_run_into_an_output_in_use_is_refused_and_the_first_run_is_intact(tmp_path):
    """The second run's start used to delete the first run's checkpoint in flight (.tmp-*)."""
    first = SecondRunWhileSaving(tmp_path)
    run = fit(tmp_path, "train.epochs=2", adapter=first)
    assert "in use by another run" in first.refusal, first.refusal
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in first.refusal  # the holder, by pid and host
    assert run.names() == ["epoch-0001", "epoch-0002"] and [r["epoch"] for r in run.metrics()] == [1, 2]
    assert not (tmp_path / ".hvdtrain.lock").exists()  # the lock goes with the run
    fit(tmp_path, "train.epochs=3", "checkpoint.resume=true")  # and the next run can take it


@pytest.mark.parametrize("cut", ["half of the last line", "the last line's closing brace"])
def test_a_torn_last_metrics_line_is_dropped_with_a_warning_naming_the_file(tmp_path, capsys, cut):
    """A kill or a full disk during the append of epoch 2's row left half a line: --resume used to
    stop with a bare JSONDecodeError. Epoch 2's row comes back from its checkpoint's manifest."""
    reference = fit(tmp_path / "reference", "train.epochs=3")
    with pytest.raises(Interrupt):  # killed early in epoch 3: epoch-0002 is its last checkpoint
        fit(tmp_path / "run", "train.epochs=3", callbacks=[StopAt(25)])
    metrics = tmp_path / "run" / "metrics.jsonl"
    text = metrics.read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    keep = len(text) - len(last) - 1 + (len(last) // 2 if cut.startswith("half") else len(last) - 1)
    metrics.write_text(text[:keep])
    capsys.readouterr()

    resumed = fit(tmp_path / "run", "train.epochs=3", "checkpoint.resume=true")
    err = capsys.readouterr().err
    assert str(metrics) in err and "torn" in err
    assert [r["epoch"] for r in resumed.metrics()] == [1, 2, 3]
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())


def test_a_damaged_metrics_line_before_the_last_is_refused_naming_file_and_line(tmp_path):
    run = fit(tmp_path, "train.epochs=2")
    metrics = run.output / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0][:10], *lines[1:]]) + "\n")
    before = snapshot_tree(tmp_path)
    with pytest.raises(TrainingError, match="line 1 ") as refused:
        fit(tmp_path, "train.epochs=3", "checkpoint.resume=true")
    assert str(metrics) in str(refused.value)
    assert snapshot_tree(tmp_path) == before


def test_the_lock_of_another_process_refuses_and_a_killed_holders_lock_does_not(tmp_path):
    """A real second process holds the lock: a run is refused naming its pid. Once that process is
    killed (SIGKILL: no clean-up, its lock file stays), the next run goes ahead."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hvdtrain.core.outputdir import OutputLock; "
         "lock = OutputLock(sys.argv[1]); assert lock.acquire() is None; lock.announce(); print('locked', flush=True); "
         "time.sleep(600)", str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TrainingError, match=f"in use by another run \\(pid {holder.pid} on host ") as refused:
            fit(tmp_path, "train.epochs=1")
        assert ".hvdtrain.lock" in str(refused.value) and "nothing was changed" in str(refused.value)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".hvdtrain.lock"]
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / ".hvdtrain.lock").exists()  # left behind by the killed holder
    run = fit(tmp_path, "train.epochs=1")
    assert run.names() == ["epoch-0001"]


def test_a_new_run_that_fails_before_its_first_epoch_leaves_the_output_unused(tmp_path, monkeypatch):
    """Otherwise its config.yaml (and event files) would make the corrected rerun a refused reuse,
    and its trackers' run ids (a real W&B run, offline) would make the rerun continue that run."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    isolate_environ(monkeypatch, ["WANDB_SERVICE"])  # set by the wandb client for its service process
    register_toy_recipe(nan_samples=range(N_TRAIN))  # the first step's gradient is NaN: the run stops
    with pytest.raises(TrainingError, match="not finite"):
        fit(tmp_path, "log.trackers=tensorboard,wandb")
    assert [p.name for p in tmp_path.iterdir()] == []
    register_toy_recipe()
    assert fit(tmp_path, "train.epochs=1").names() == ["epoch-0001"]
