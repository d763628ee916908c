"""Preemption on a real 2-rank job: rank 1 alone is sent SIGUSR1 (a scheduler's warning before a
time limit) mid-epoch; both ranks stop at the same optimizer step after a step checkpoint, the
job exits non-zero with the workers' exit code 75, and the same command with ``--resume auto``
continues it to weights, running statistics and metrics bitwise equal to an uninterrupted run
(ResNet-18 on 8x8 images: its BatchNorm statistics differ between the ranks between evaluations,
and the stop's checkpoint keeps each rank's own). Each rank's random stream (dropout) across a stop:
tests/slurm's time-limit job (torch) and scontrol-requeue job (TensorFlow, with BatchNorm too).
In-process cases (every boundary, auto-resume refusals, a second SIGTERM) are
tests/fast/test_preemption.py."""

import os
import re
import signal
import subprocess
import time

import pytest

from jobs import (BIN, assert_own_statistics_kept, assert_same_run, checkpoint_weights as weights, horovodrun,
                  hvdtrain_cli, job_env, worker_pid)

pytestmark = [pytest.mark.distributed, pytest.mark.resume]
# 512 samples / 2 ranks / batch 32 = 8 steps per epoch; steps slowed to 0.3 s from step 10 so the signal,
# sent once step-00000010 is written, lands mid-epoch 2
RUN = ["--epochs", "2", "--batch-size", "32", "--set", "data.max_train_samples=512", "--set",
       "data.max_val_samples=64", "--set", "train.log_every=0", "--set", "checkpoint.every_steps=5",
       "--set", "train.tensorboard=false", "--set", "train.deterministic=true",
       "--set", "model.name=resnet18", "--set", "image.size=8"]  # BatchNorm


def command(out, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--output", out, *RUN, *extra]


def test_a_signal_to_one_rank_stops_both_at_one_step_and_auto_resume_is_bitwise_equal(tmp_path):
    straight, signalled = tmp_path / "straight", tmp_path / "signalled"
    horovodrun(command(straight), timeout=400)

    job = subprocess.Popen([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                            *command(signalled, "--resume", "auto")],
                           env={**job_env(), "HVDTRAIN_FAULT": "slow:step=10:ms=300"}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        rank1 = worker_pid(1, str(signalled))
        while not (signalled / "checkpoints" / "step-00000010").is_dir() and job.poll() is None:
            time.sleep(0.05)
        os.kill(rank1, signal.SIGUSR1)
        out, _ = job.communicate(timeout=400)
    finally:
        job.kill()
    assert job.returncode != 0, out[-3000:]
    assert "rank 1: SIGUSR1 received" in out and "rank 0: SIGUSR1" not in out, out[-3000:]
    assert "SIGUSR1 received: stopped every rank after optimizer step" in out, out[-3000:]
    assert re.search(r"exit with status code 75|exit code:? 75", out), out[-3000:]  # horovodrun names the workers' code
    stopped = max(p.name for p in (signalled / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert "step-00000010" < stopped < "step-00000016", stopped  # mid-epoch 2, after the signal
    assert_own_statistics_kept(signalled / "checkpoints" / stopped)

    resumed = horovodrun(command(signalled, "--resume", "auto"), timeout=400)
    assert stopped in resumed.stdout
    final = weights(straight / "checkpoints" / "epoch-0002", "torch")
    assert any(k.endswith("running_var") for k in final)  # the statistics are compared too
    assert_same_run(final, weights(signalled / "checkpoints" / "epoch-0002", "torch"), straight, signalled)
