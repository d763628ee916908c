"""Each failure-handling promise of hvdtrain, tried for real (most under `horovodrun -np 2 --gloo`).

Faults are injected with HVDTRAIN_FAULT (hvdtrain/core/faults.py): a worker that raises, a worker
that hangs, a NaN batch, a crash between writing a checkpoint and publishing it.
"""

import hashlib
import json
import re
import resource
import signal

import numpy as np
import pytest

from jobs import horovodrun, hvdtrain_cli, run

from hvdtrain.core.watchdog import STALL_EXIT_CODE

# 256 samples / 2 ranks / batch 16 = 8 optimizer steps per epoch.
TINY = ["--batch-size", "16", "--set", "data.max_train_samples=256", "--set", "data.max_val_samples=64",
        "--set", "train.log_every=0"]


def recipe(out, *extra, framework="torch"):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *TINY, *extra]


def checkpoint_names(out):
    folder = out / "checkpoints"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def tree_digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.distributed
def test_a_rank_that_raises_brings_the_job_down_with_its_traceback(tmp_path):
    # a job that does not come down fails on the call's timeout (a hang bound, not a timing: no
    # wall-clock bound that a slow or loaded machine could miss)
    proc = horovodrun(recipe(tmp_path / "run", "--epochs", "1"), check=False, timeout=300,
                      env={"HVDTRAIN_FAULT": "raise:rank=1:step=3"})
    assert proc.returncode != 0
    assert "injected failure on rank 1 at step 3" in proc.stdout + proc.stderr


@pytest.mark.distributed
def test_a_hung_rank_becomes_an_error_after_the_stall_timeout(tmp_path):
    # without the stall timeout the job would hang until the call's timeout (its failure); the
    # witness that the stall timeout ended it is its message below, not the wall-clock time
    proc = horovodrun(recipe(tmp_path / "run", "--epochs", "1", "--set", "train.stall_timeout_sec=10"),
                      check=False, env={"HVDTRAIN_FAULT": "hang:rank=1:step=3"}, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "train.stall_timeout_sec=10" in output
    assert "rank 1 did not arrive at the collective" in output
    assert "rank 0: no progress" in output and "waiting in collectives" in output
    # the stall's own exit code, not the preemption's 75 (a job script requeues on 75): horovodrun names it
    assert re.search(rf"exit with status code {STALL_EXIT_CODE}|exit code:? {STALL_EXIT_CODE}", output), output[-3000:]


@pytest.mark.distributed
def test_crash_before_publishing_keeps_the_previous_checkpoint_and_a_corrupted_one_is_named(tmp_path):
    """One run, three jobs: a crash between writing checkpoint step 12 and publishing it leaves
    epoch-0001, which the resume continues from; then the finished run's last checkpoint is
    truncated and the next resume names it and falls back to the one before, step-00000012 (the
    in-process lane, tests/fast/test_resume_planning.py, tries truncation and corruption at length)."""
    out = tmp_path / "run"
    args = ["--epochs", "2", "--set", "checkpoint.every_steps=4"]
    proc = horovodrun(recipe(out, *args), check=False, env={"HVDTRAIN_FAULT": "crash-in-checkpoint:step=12"})
    assert proc.returncode != 0
    names = checkpoint_names(out)
    assert "epoch-0001" in names and "step-00000012" not in names
    assert any(n.startswith(".tmp-step-00000012") for n in names), names  # the half-written one, unpublished

    resumed = horovodrun(recipe(out, *args, "--resume"))
    assert "epoch-0001" in resumed.stdout and "at epoch 2" in resumed.stdout
    names = checkpoint_names(out)
    assert "epoch-0002" in names and "step-00000012" in names and not any(n.startswith(".tmp-") for n in names)

    model = out / "checkpoints" / "epoch-0002" / "model.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # truncated by a full disk, say
    proc = horovodrun(recipe(out, *args, "--resume"))
    output = proc.stdout + proc.stderr
    assert "epoch-0002" in output and "model.pt" in output and "SHA-256" in output
    assert "resuming from" in output and "step-00000012 at epoch 2, after" in output
    names = checkpoint_names(out)
    assert "epoch-0002" in names and any(n.startswith(".corrupt-epoch-0002") for n in names)  # kept, not lost
    assert [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


# the stop is the Trainer's, after either adapter's finite check (the policy in-process:
# tests/fast/test_nonfinite.py). TensorFlow applies the update before its check (the update does not
# wait for the gradient's norm) and must still stop at that step with nothing saved.
@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_nan_loss_stops_naming_the_step_and_saves_nothing(tmp_path, framework):
    out = tmp_path / "run"
    proc = horovodrun(recipe(out, "--epochs", "1", framework=framework), check=False,
                      env={"HVDTRAIN_FAULT": "nan:rank=1:step=5"})
    assert proc.returncode != 0
    assert "not finite" in proc.stderr and "optimizer step 6" in proc.stderr
    assert checkpoint_names(out) == []


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_nan_loss_can_skip_the_update(tmp_path, framework):
    out = tmp_path / "run"
    horovodrun(recipe(out, "--epochs", "2", "--set", "train.nonfinite=skip", framework=framework),
               env={"HVDTRAIN_FAULT": "nan:rank=1:step=5"})
    first, second = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert first["skipped_updates"] == 1 and np.isfinite(first["val_loss"])
    assert "skipped_updates" not in second  # per epoch (issue 10, item 8), not a running total


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_disk_full_during_a_checkpoint_leaves_nothing_partial(tmp_path):
    out = tmp_path / "run"
    proc = run(recipe(out, "--epochs", "1"), check=False, preexec_fn=_limit_file_size)
    assert proc.returncode == 1
    assert "could not write checkpoint epoch-0001" in proc.stderr and "nothing partial" in proc.stderr
    assert checkpoint_names(out) == []


def test_unwritable_output_is_an_error_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run(recipe(blocker / "run", "--epochs", "1"), check=False)
    assert proc.returncode == 1 and "not writable" in proc.stderr and str(blocker) in proc.stderr


# optim.name, train.batch_size and train.grad_accumulation are refused the same way, in-process:
# tests/fast/test_resume_planning.py::test_resume_across_a_state_defining_change_is_refused_naming_the_key
INCOMPATIBLE = [(["--framework", "tensorflow"], "framework 'torch'"), (["--set", "model.name=resnet18"], "model.name=")]


def test_resume_into_an_incompatible_run_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    run(recipe(out, "--epochs", "1"))  # one run, refused resumes of it in turn (each refusal changes nothing)
    before = tree_digest(out)
    for change, needle in INCOMPATIBLE:
        proc = run(recipe(out, "--epochs", "2", "--resume") + change, check=False)
        assert proc.returncode == 1 and "cannot resume" in proc.stderr and needle in proc.stderr, proc.stderr
        assert tree_digest(out) == before, change
