"""issue 10, item 3b: the same config learns the same small real-image task in both frameworks.

ResNet-18 (BatchNorm throughout) on real MNIST digits resized to 12x12 pixels, 1,024 training
images, 2 epochs on 2 workers (`horovodrun -np 2 --gloo`), base LR 0.02 (the recipe's 0.05, scaled
to 0.1 for 2 workers, overshoots in so few steps: both frameworks' epoch-1 loss rose above 4 and
they ended at 0.71 and 0.78): torch and TensorFlow both reach a
validation accuracy far above chance and within a few points of each other. Before the Keras
model used torch's BatchNorm momentum, TensorFlow stayed at chance here (its moving statistics
were still mostly their initial values when it was evaluated).

12x12 since 2026-11-27 (was 16x16): 94 CPU-s for the two jobs instead of 120, and the same
result (torch 0.906, TensorFlow 0.945 against 0.918 and 0.945); at 8x8 torch ended at 0.797 and
TensorFlow at 0.730, too few pixels for the claim."""

import json

import pytest

from jobs import horovodrun, hvdtrain_cli

ARGS = ["--set", "model.name=resnet18", "--set", "data.image_size=12", "--epochs", "2", "--batch-size", "32",
        "--set", "data.max_train_samples=1024", "--set", "data.max_val_samples=256", "--set", "train.log_every=0",
        "--set", "train.tensorboard=false", "--set", "checkpoint.enabled=false", "--set", "optim.lr=0.02"]


@pytest.mark.distributed
def test_resnet18_learns_the_same_in_torch_and_tensorflow(tmp_path):
    accuracy = {}
    for framework in ("torch", "tensorflow"):
        out = tmp_path / framework
        horovodrun([hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out,
                    *ARGS], timeout=600)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        accuracy[framework] = rows[-1]["val_accuracy"]
    assert min(accuracy.values()) >= 0.8, accuracy
    assert abs(accuracy["torch"] - accuracy["tensorflow"]) <= 0.08, accuracy
