"""User recipes under real `horovodrun -np 2 --gloo`, and what a run leaves to look at.

* ``hvdtrain recipe examples/my_recipe.py``: a recipe file, 2 epochs on an MNIST subset; its
  TensorBoard event files are read with TensorBoard's own EventAccumulator and ``hvdtrain report``
  turns the run into PNG plots whose curves are checked pixel by pixel;
* an installed package's ``hvdtrain.recipes`` entry point (a dist-info folder on PYTHONPATH).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from PIL import Image

from jobs import REPO, horovodrun, hvdtrain_cli, run

SUBSET = ["--set", "data.max_train_samples=1200", "--set", "data.max_val_samples=300", "--set", "train.log_every=0"]
STEPS_PER_EPOCH = 10  # 1200 samples / 2 workers / batch 64, rounded up
TAB = {"blue": (31, 119, 180), "orange": (255, 127, 14), "green": (44, 160, 44), "purple": (148, 103, 189)}


def read_metrics(output):
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def file_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("recipe-file") / "run"
    proc = horovodrun([hvdtrain_cli(), "recipe", REPO / "examples" / "my_recipe.py", "--framework", "torch",
                       "--epochs", "2", "--output", out, *SUBSET])
    return out, proc


@pytest.mark.distributed
def test_recipe_file_trains_on_two_workers(file_run):
    out, proc = file_run
    rows = read_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2] and {r["world_size"] for r in rows} == {2}
    assert rows[-1]["val_accuracy"] >= 0.6, rows  # it learns: chance is 0.1
    assert yaml.safe_load((out / "config.yaml").read_text())["recipe"] == "mnist-mlp"
    assert "\r" not in proc.stdout  # the progress bar stays quiet when output is not a terminal


@pytest.mark.distributed
def test_tensorboard_reads_the_event_files(file_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = file_run
    events = EventAccumulator(str(out))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"step/loss", "step/lr", "step/samples_per_sec", "epoch/train_loss", "epoch/val_loss",
            "epoch/val_accuracy", "epoch/lr", "epoch/samples_per_sec"} <= tags
    assert [e.step for e in events.Scalars("step/loss")] == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    rows = read_metrics(out)
    accuracy = events.Scalars("epoch/val_accuracy")
    assert [e.step for e in accuracy] == [1, 2]
    assert [e.value for e in accuracy] == pytest.approx([r["val_accuracy"] for r in rows], rel=1e-6)
    lrs = [e.value for e in events.Scalars("step/lr")]
    assert max(lrs) == pytest.approx(0.04) and lrs[-1] < lrs[len(lrs) // 2]  # warmup to 2 x 0.02, then decay


def _pixels_near(image: np.ndarray, rgb, tolerance=40) -> int:
    return int((np.abs(image[:, :, :3].astype(int) - np.array(rgb)).sum(axis=2) < tolerance).sum())


@pytest.mark.distributed
def test_report_draws_the_curves(file_run):
    out, _ = file_run
    proc = run([hvdtrain_cli(), "report", out])
    assert "final val_accuracy" in proc.stdout
    expected = {"loss": ("blue", "orange"), "accuracy": ("blue",), "lr": ("green",), "throughput": ("purple",),
                "summary": ("blue", "orange", "green", "purple")}
    for name, colors in expected.items():
        path = out / "report" / f"{name}.png"
        assert f"wrote {path}" in proc.stdout
        image = np.asarray(Image.open(path).convert("RGB"))
        height, width, _ = image.shape
        assert (width, height) == ((909, 1285) if name == "summary" else (770, 462))  # A4 page; 7 x 4.2 in, 110 dpi
        assert (image.sum(axis=2) < 600).mean() > 0.01, f"{name}.png is blank"
        for color in colors:  # each curve's colour is really drawn, not just the legend swatch
            assert _pixels_near(image, TAB[color]) > 150, f"{name}.png: no {color} curve"


@pytest.mark.distributed
def test_entry_point_recipe_runs_on_two_workers(tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "hvdtrain_demo_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hvdtrain-demo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hvdtrain.recipes]\nplugin-mlp = hvdtrain_demo_plugin\n")
    source = (REPO / "examples" / "my_recipe.py").read_text()
    (site / "hvdtrain_demo_plugin.py").write_text(source.replace('"mnist-mlp"', '"plugin-mlp"'))
    monkeypatch.setenv("PYTHONPATH", str(site))

    assert "plugin-mlp" in run([hvdtrain_cli(), "recipes"]).stdout
    out = tmp_path / "run"
    horovodrun([hvdtrain_cli(), "recipe", "plugin-mlp", "--framework", "torch", "--epochs", "1",
                "--output", out, *SUBSET])
    rows = read_metrics(out)
    assert rows[-1]["world_size"] == 2 and rows[-1]["epoch"] == 1
    assert yaml.safe_load((out / "config.yaml").read_text())["recipe"] == "plugin-mlp"
