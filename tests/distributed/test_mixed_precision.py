"""issue 10, item 4: TensorFlow fp16 trains with dynamic loss scaling, like torch's GradScaler.

The adapter wraps the optimizer in Keras's LossScaleOptimizer: a normal update equals the fp32
gradient step (up to float16 rounding), an overflowing update is skipped, counted in
``skipped_updates`` (not raised as a non-finite gradient) and halves the scale, and the scale is
part of the optimizer state that checkpoints write and read back. Runs on the CPU: TensorFlow
executes float16 there, only the CLI insists on a GPU for fp16."""

import json

import pytest

from jobs import REPO, run

WORKER = REPO / "tests" / "distributed" / "workers" / "tf_loss_scaling.py"


def test_tensorflow_fp16_scales_the_loss_skips_overflows_and_checkpoints_the_scale(tmp_path):
    report_path = tmp_path / "report.json"
    run(["python", WORKER, report_path, tmp_path / "checkpoint"], timeout=300)
    report = json.loads(report_path.read_text())
    assert report["optimizer"] == "LossScaleOptimizer"
    assert report["initial_scale"] == 2.0 ** 15
    assert report["update_size"] > 1e-3
    assert report["update_error"] <= 2e-2 * report["update_size"], report  # float16 forward, unscaled gradient
    assert report["skipped_after_finite"] == 0
    assert report["skipped_after_overflow"] == 1
    assert report["scale_after_overflow"] == pytest.approx(5e29, rel=1e-6)
    assert report["weights_unchanged_by_overflow"]
    assert report["restored_scale"] == report["saved_scale"] == report["scale_after_overflow"]
    assert report["restored_counter"] == 0
