"""Exact resume: a 2-rank run whose worker is killed with SIGKILL mid-epoch and restarted with
`--resume` ends with weights and metrics bitwise equal to an uninterrupted run (same world size),
for torch and TensorFlow on CPU."""

import time

import numpy as np
import pytest

from jobs import checkpoint_weights, horovodrun, hvdtrain_cli, run_metrics as metrics

# 1,024 samples / 2 ranks / batch 32 = 16 steps per epoch; checkpoints every 4 optimizer steps.
RUN = ["--epochs", "2", "--batch-size", "32", "--set", "data.max_train_samples=1024",
       "--set", "data.max_val_samples=256", "--set", "train.log_every=0", "--set", "checkpoint.every_steps=4",
       "--set", "train.deterministic=true"]
KILL_AT = 22  # optimizer step in epoch 2; the last checkpoint before it is step 20


def command(framework, out, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *RUN, *extra]


def final_weights(out, framework):
    return checkpoint_weights(out / "checkpoints" / "epoch-0002", framework)


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_kill_mid_epoch_then_resume_is_bitwise_equal(tmp_path, framework):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    horovodrun(command(framework, straight))

    started = time.monotonic()
    crash = horovodrun(command(framework, killed), check=False, env={"HVDTRAIN_FAULT": f"kill:rank=1:step={KILL_AT}"})
    assert crash.returncode != 0
    assert time.monotonic() - started < 240, "the job did not come down after a worker was killed"
    names = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert "step-00000020" in names and "epoch-0002" not in names, names

    resumed = horovodrun(command(framework, killed, "--resume"))
    assert "step-00000020" in resumed.stdout and "after" in resumed.stdout

    a, b = final_weights(straight, framework), final_weights(killed, framework)
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), f"{key} differs after resume"
    for row_a, row_b in zip(metrics(straight), metrics(killed)):
        for key in ("epoch", "train_loss", "val_loss", "val_accuracy", "step"):
            assert row_a[key] == row_b[key], (key, row_a, row_b)
