"""Early stopping in a real 2-rank Horovod job, both frameworks, and TensorFlow's quiet start-up.

If only rank 0 decided to stop, rank 1 would go on into the next epoch's allreduce and wait for
a partner that has left: the job would hang (or fail when Gloo notices). The job runs under a
timeout in its own session, killed whole if it hangs. The stop epoch is known in advance: with
``train.early_stopping_min_delta`` far larger than any change of ``val_loss``, epoch 1 sets the
mark and epoch 2 cannot beat it, so patience 1 stops after epoch 2 of 4.

The jobs run without ``TF_CPP_MIN_LOG_LEVEL`` in their environment (tests/jobs.py sets one for
other tests): the TensorFlow job's output must hold none of TensorFlow's start-up lines, on any
rank. A single-process run with the user's ``TF_CPP_MIN_LOG_LEVEL=0`` shows TensorFlow's C++ INFO
lines (respected). Its witness is a line every machine prints at that level: the user also asks for
one source file's verbose lines (``TF_CPP_VMODULE=process_util=1``), and TensorFlow's "Session inter
op parallelism threads" line, written through the level's filter when the eager context starts,
must appear; the 2-rank TensorFlow job above, asked for the same verbose lines at hvdtrain's
default level, must show none of them. (The start-up lines depend on the processor: on a CPU without the instructions that
turn oneDNN on, TensorFlow printed no "oneDNN custom operations are on" line, and one that has every
instruction the binary was built for gets no CPU feature guard line; they are no witness.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from jobs import BIN, REPO, hvdtrain_cli, job_env, run_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.resume]

HANG_TIMEOUT = 300  # a tiny job takes 20-60 s here; past this it is taken to hang
TINY = ["--set", "data.max_train_samples=128", "--set", "data.max_val_samples=64", "--set", "train.log_every=0"]
STOP = ["--epochs", "4", "--set", "train.early_stopping=1", "--set", "train.early_stopping_metric=val_loss",
        "--set", "train.early_stopping_min_delta=1000"]
# one source file's verbose (INFO) lines: printed on every machine when the eager context starts,
# and only when TF_CPP_MIN_LOG_LEVEL lets INFO through
VERBOSE = "process_util=1"
VERBOSE_LINE = r"^I\d{4} .*process_util\.cc:\d+\] Session inter op parallelism threads: \d+"
START_UP_NOISE = ("absl::InitializeLog()", "oneDNN custom operations", "cpu_feature_guard", "AutoGraph could not")


def launch(cmd: list, env_extra: dict | None = None, timeout: float = HANG_TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``cmd`` with the jobs' environment minus any TensorFlow log level (plus ``env_extra``) in
    a session of its own; on timeout the whole session (launcher and ranks) is killed and the test
    fails naming the hang."""
    env = {k: v for k, v in job_env().items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "HVDTRAIN_TF_LOG_DEFAULT")}
    env.update(env_extra or {})
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job hung for {timeout} s (not every rank stopped?)\n{out[-4000:]}\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_every_rank_stops_after_the_same_epoch(tmp_path, framework):
    out = tmp_path / "run"
    job = launch([BIN / "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", hvdtrain_cli(), "recipe",
                  "image-classification", "--framework", framework, "--output", out, *TINY, *STOP],
                 env_extra={"TF_CPP_VMODULE": VERBOSE})  # at hvdtrain's default level its INFO lines stay out
    text = job.stdout + job.stderr
    assert job.returncode == 0, text[-6000:]  # every rank left the loop and exited cleanly
    rows = run_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2]
    stop = rows[-1]["early_stopping"]
    assert stop["stopped"] is True and stop["best_epoch"] == 1 and stop["epochs_without_improvement"] == 1
    assert stop["metric"] == "val_loss" and stop["mode"] == "min" and stop["patience"] == 1
    assert text.count("hvdtrain: early stopping after epoch 2 of 4: val_loss has not improved") == 1  # rank 0
    assert text.count("hvdtrain: done") == 1
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["epoch-0001", "epoch-0002"]  # the final checkpoint as usual
    manifest = json.loads((out / "checkpoints" / "epoch-0002" / "manifest.json").read_text())
    assert manifest["metrics"]["early_stopping"]["stopped"] is True and manifest["world_size"] == 2
    if framework == "tensorflow":  # quiet by default on every rank: no start-up line, no AutoGraph warning
        noisy = [line for line in text.splitlines() if any(n in line for n in START_UP_NOISE)]
        assert noisy == [], noisy
        # the log-level test's witness is TensorFlow's level at work, not a line printed anyway
        assert not re.search(VERBOSE_LINE, text, re.M), text[-3000:]


@pytest.mark.e2e
def test_a_users_tensorflow_log_level_is_respected(tmp_path):
    job = launch([hvdtrain_cli(), "recipe", "image-classification", "--framework", "tensorflow", "--output",
                  tmp_path / "run", "--epochs", "1", "--set", "data.max_train_samples=32", "--set",
                  "data.max_val_samples=32"], env_extra={"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": VERBOSE})
    assert job.returncode == 0, (job.stdout + job.stderr)[-6000:]
    assert re.search(VERBOSE_LINE, job.stderr, re.M), job.stderr[-6000:]  # an INFO line: level 0 reached TensorFlow

