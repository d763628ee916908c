"""issue 39, item 2: ``hvdtrain.torch.prepare`` under real ``horovodrun -np 2 --gloo`` (three launches
in one test: tests/distributed/workers/own_loop.py, then examples/own_loop_torch.py twice).

* A plain torch loop through prepare() ends with the Trainer's weights on the same task, bit for bit,
  with allreduce (flat buffers), PowerSGD and ZeRO-2: the same exchange runs.
* The example (examples/own_loop_torch.py) stopped after update 7, then resumed with ``--resume`` on 2
  workers, ends with the uninterrupted run's model, optimizer and scheduler state, bit for bit.
* The same stopped run resumed alone (one process, no launcher) goes on at the next sample: the
  position and update count carry over, the checkpoints name world size 1, and ``hvdtrain report``
  reads the output folder.
"""

import json
import shutil
import subprocess

import numpy as np
import pytest
import torch

from jobs import BIN, REPO, horovodrun, run

WORKER = REPO / "tests" / "distributed" / "workers" / "own_loop.py"
EXAMPLE = REPO / "examples" / "own_loop_torch.py"
ARGS = ["--samples", "256", "--batch-size", "16", "--epochs", "2", "--checkpoint-every", "3"]


def state(checkpoint):
    return {name: torch.load(checkpoint / name, weights_only=True)
            for name in ("model.pt", "optimizer.pt", "lr_scheduler.pt")}


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif torch.is_tensor(a):
        assert torch.equal(a, b)
    else:
        assert a == b


@pytest.mark.distributed
def test_own_loop_matches_the_trainer_and_resumes_exactly(tmp_path):
    report_path = tmp_path / "report.json"
    horovodrun(["python", WORKER, report_path, tmp_path], timeout=500)
    report = json.loads(report_path.read_text())
    ran = {name: report[name]["exchange"] for name in ("allreduce", "powersgd", "zero2")}
    assert ran == {"allreduce": "FlatAllreduce", "powersgd": "Compressed", "zero2": "FlatReduceScatter"}
    for name in ran:
        for own, trainer in zip(report[name]["own"], report[name]["trainer"]):
            np.testing.assert_array_equal(np.asarray(own), np.asarray(trainer), err_msg=name)
    # PowerSGD (rank 1) did compress: its weights are not allreduce's
    assert not np.allclose(np.asarray(report["allreduce"]["own"][0]), np.asarray(report["powersgd"]["own"][0]))

    # killed after update 7 (the last checkpoint: step 6), resumed on 2 workers and, from a copy, alone
    reference, stopped = tmp_path / "example-reference", tmp_path / "example-run"
    assert report["stopped"] and (stopped / "checkpoints" / "step-00000006").is_dir()
    assert not (stopped / "checkpoints" / "epoch-0001").exists()  # 8 updates per epoch on 2 workers
    alone = tmp_path / "example-alone"
    shutil.copytree(stopped, alone)
    out = horovodrun(["python", EXAMPLE, *ARGS, "--output", stopped, "--resume"], timeout=300).stdout
    assert "resumed at epoch 1, after 192 samples (update 6)" in out
    assert_same(state(stopped / "checkpoints" / "epoch-0002"), state(reference / "checkpoints" / "epoch-0002"))
    rows = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and [r["step"] for r in rows] == [8, 16]

    # alone: the other 64 samples of epoch 1 on one worker (4 updates of 16), then epoch 2 (16 updates)
    out = run([BIN / "python", EXAMPLE, *ARGS, "--output", alone, "--resume"], timeout=300).stdout
    assert "resumed at epoch 1, after 192 samples (update 6)" in out
    manifest = json.loads((alone / "checkpoints" / "epoch-0002" / "manifest.json").read_text())
    assert (manifest["world_size"], manifest["step"], manifest["epoch"]) == (1, 6 + 4 + 16, 2)
    rows = [json.loads(line) for line in (alone / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["step"]) for r in rows] == [(1, 10), (2, 26)]
    report_run = subprocess.run([BIN / "hvdtrain", "report", alone], capture_output=True, text=True, timeout=300)
    assert report_run.returncode == 0, report_run.stderr
    assert (alone / "report" / "summary.png").is_file()


@pytest.mark.distributed
def test_a_save_called_on_rank_0_only_ends_the_job_with_one_line(tmp_path):
    """issue 61, item 4: the DDP habit ``if rank == 0: run.save(...)`` hung forever with no message
    (rank 0 in the checkpoint's collectives, rank 1 in the next update's gradient exchange). With
    ``train.stall_timeout_sec=10`` the job now ends non-zero with rank 0's one line naming the call
    and the rank that did not make it; no traceback from hvdtrain's side."""
    out = tmp_path / "run"
    proc = horovodrun(["python", REPO / "tests" / "distributed" / "workers" / "own_loop_rank0_save.py", out],
                      timeout=240, check=False)
    assert proc.returncode != 0 and "finished" not in proc.stdout
    lines = [line.split(":", 1)[1] for line in proc.stderr.splitlines() if "hvdtrain: error:" in line]
    assert lines == ["hvdtrain: error: rank 0 called run.save at update 2 and waited 10s (train.stall_timeout_sec="
                     "10): rank 1 did not call it; run.save is a collective: call it on every rank at the same point "
                     "(rank 0 writes the files), not under `if rank == 0:`"]
    assert "prepare.py" not in proc.stderr  # no traceback through hvdtrain's frames on either rank
    assert not (out / "checkpoints").exists()
