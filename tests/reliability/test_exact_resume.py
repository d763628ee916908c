"""Exact resume: a 2-rank run whose worker is killed with SIGKILL mid-epoch and restarted with
`--resume` ends with weights and metrics bitwise equal to an uninterrupted run (same world size),
for torch and TensorFlow on CPU, on a model with BatchNorm (the image recipe's ResNet-18 at 8x8
pixels) under real `horovodrun -np 2 --gloo`.

Running statistics are averaged over the ranks before every evaluation and mid-epoch checkpoint,
so the validation metrics a run reports are those of the checkpoint it saves (a one-process
evaluation of that checkpoint agrees). Resume with dropout (the default small CNN) and with
gradient-compression state is proven by tests/reliability/test_compression_resume.py, with
pipeline stages by tests/distributed/test_pipeline.py, and in-process on every boundary by
tests/fast/test_kill_and_resume.py."""

import json

import pytest

from jobs import REPO, assert_same_run, checkpoint_weights as weights, horovodrun, hvdtrain_cli, run, \
    run_metrics as rows

EVAL = REPO / "tests" / "distributed" / "workers" / "eval_checkpoint.py"
# 256 samples / 2 ranks / batch 16 = 8 steps per epoch; checkpoints every 4 steps; the kill at
# step 14 (in epoch 2) leaves step-00000012 as the latest.
RUN = ["--set", "model.name=resnet18", "--set", "data.image_size=8", "--epochs", "2", "--batch-size", "16",
       "--set", "data.max_train_samples=256", "--set", "data.max_val_samples=64", "--set", "train.log_every=0",
       "--set", "checkpoint.every_steps=4", "--set", "train.deterministic=true", "--set", "train.tensorboard=false"]
KILL_AT = 14


def command(framework, out, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *RUN, *extra]


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_kill_mid_epoch_then_resume_is_bitwise_equal_and_metrics_describe_the_saved_model(tmp_path, framework):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    horovodrun(command(framework, straight), timeout=400)
    final = straight / "checkpoints" / "epoch-0002"

    report = tmp_path / "eval.json"
    run(["python", EVAL, straight, final, report], timeout=300)
    alone, reported = json.loads(report.read_text()), rows(straight)[-1]
    assert alone["accuracy"] == reported["val_accuracy"], (alone, reported)
    assert alone["loss"] == pytest.approx(reported["val_loss"], rel=1e-5), (alone, reported)

    # a job that does not come down after a worker was killed fails on the call's timeout (a hang bound)
    crash = horovodrun(command(framework, killed), check=False, timeout=400,
                       env={"HVDTRAIN_FAULT": f"kill:rank=1:step={KILL_AT}"})
    assert crash.returncode != 0
    names = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert "step-00000012" in names and "epoch-0002" not in names, (names, crash.stdout[-4000:], crash.stderr[-4000:])

    resumed = horovodrun(command(framework, killed, "--resume"), timeout=400)
    assert "step-00000012" in resumed.stdout and "after" in resumed.stdout
    assert_same_run(weights(final, framework), weights(killed / "checkpoints" / "epoch-0002", framework),
                    straight, killed)
