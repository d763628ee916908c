"""issue 10, item 3: a model with BatchNorm (the image recipe's ResNet-18 at 8x8 pixels) under
real `horovodrun -np 2 --gloo`, both frameworks.

Running statistics are averaged over the ranks before every evaluation and mid-epoch checkpoint,
so the validation metrics a run reports are those of the checkpoint it saves (a one-process
evaluation of that checkpoint agrees), and a worker killed mid-epoch and resumed ends bitwise
equal to an uninterrupted run, metrics included."""

import json

import numpy as np
import pytest

from jobs import REPO, checkpoint_weights as weights, horovodrun, hvdtrain_cli, run, run_metrics as rows

EVAL = REPO / "tests" / "distributed" / "workers" / "eval_checkpoint.py"
# 256 samples / 2 ranks / batch 16 = 8 steps per epoch; checkpoints every 4 steps; the kill at
# step 14 leaves step-00000012 as the latest.
RUN = ["--set", "model.name=resnet18", "--set", "data.image_size=8", "--epochs", "2", "--batch-size", "16",
       "--set", "data.max_train_samples=256", "--set", "data.max_val_samples=64", "--set", "train.log_every=0",
       "--set", "checkpoint.every_steps=4", "--set", "train.deterministic=true", "--set", "train.tensorboard=false"]


def command(framework, out, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *RUN, *extra]


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_batchnorm_metrics_describe_the_saved_model_and_resume_is_exact(tmp_path, framework):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    horovodrun(command(framework, straight), timeout=400)
    final = straight / "checkpoints" / "epoch-0002"

    report = tmp_path / "eval.json"
    run(["python", EVAL, straight, final, report], timeout=300)
    alone, reported = json.loads(report.read_text()), rows(straight)[-1]
    assert alone["accuracy"] == reported["val_accuracy"], (alone, reported)
    assert alone["loss"] == pytest.approx(reported["val_loss"], rel=1e-5), (alone, reported)

    crash = horovodrun(command(framework, killed), check=False, env={"HVDTRAIN_FAULT": "kill:rank=1:step=14"},
                       timeout=400)
    assert crash.returncode != 0
    horovodrun(command(framework, killed, "--resume"), timeout=400)
    a, b = weights(final, framework), weights(killed / "checkpoints" / "epoch-0002", framework)
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), f"{key} differs after resume"
    for row_a, row_b in zip(rows(straight), rows(killed)):
        for key in ("epoch", "train_loss", "val_loss", "val_accuracy", "step"):
            assert row_a[key] == row_b[key], (key, row_a, row_b)
