"""TensorBoard event files from the TensorBoardCallback: rank 0 only, per-step and per-epoch tags,
read back by hvdtrain's reader (TensorBoard's own reader is used on a real run in
tests/distributed/test_user_recipes.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from hvdtrain.core.adapter import DistContext
from hvdtrain.core.resolve import load_config
from hvdtrain.observability.tensorboard_log import TensorBoardCallback, event_files, read_scalars
from hvdtrain.trainer import default_callbacks

STEPS = 4


def _train(output, rank=0, epochs=(0, 1), loss_offset=0.0):
    config = load_config(overrides=["train.batch_size=8"])
    callback = TensorBoardCallback()
    callback.on_train_begin(DistContext(rank=rank, size=2), {"config": config, "output": output,
                                                             "steps_per_epoch": STEPS})
    for epoch in epochs:
        for i in range(STEPS):
            callback.on_step_end(epoch, i, {"loss": loss_offset + 10 * epoch + i, "lr": 0.1 * (i + 1),
                                            "samples_per_sec": 100.0 + i, "samples": 8 * (i + 1), "steps": STEPS})
        callback.on_epoch_end(epoch, {"epoch": epoch + 1, "train_loss": 1.0 / (epoch + 1), "val_loss": 2.0,
                                      "val_accuracy": 0.5 + epoch / 10, "lr": 0.05, "samples_per_sec": 99.0,
                                      "world_size": 2, "step": STEPS * (epoch + 1)})
    callback.on_train_end(None)


def test_rank0_writes_step_and_epoch_scalars(tmp_path):
    _train(tmp_path)
    assert len(event_files(tmp_path)) == 1
    scalars = read_scalars(tmp_path)
    assert set(scalars) == {"step/loss", "step/lr", "step/samples_per_sec", "epoch/train_loss", "epoch/val_loss",
                            "epoch/val_accuracy", "epoch/lr", "epoch/samples_per_sec"}
    assert scalars["step/loss"] == [(s, float(v)) for s, v in zip(range(1, 9), [0, 1, 2, 3, 10, 11, 12, 13])]
    assert [round(v, 6) for _, v in scalars["epoch/val_accuracy"]] == [0.5, 0.6]
    assert [s for s, _ in scalars["epoch/train_loss"]] == [1, 2]


def test_other_ranks_write_nothing(tmp_path):
    _train(tmp_path, rank=1)
    assert event_files(tmp_path) == []


def test_a_resumed_run_replaces_the_points_it_repeats(tmp_path):
    _train(tmp_path, epochs=(0, 1))
    _train(tmp_path, epochs=(1,), loss_offset=100.0)  # resumed at epoch 2: a second event file
    assert len(event_files(tmp_path)) == 2
    losses = read_scalars(tmp_path)["step/loss"]
    assert [s for s, _ in losses] == list(range(1, 9))
    assert [v for _, v in losses][4:] == [110.0, 111.0, 112.0, 113.0]


def test_config_switches_the_default_callbacks():
    names = lambda cfg: [type(c).__name__ for c in default_callbacks(cfg)]  # noqa: E731
    assert names(load_config()) == ["TensorBoardCallback", "ProgressBar"]
    assert names(load_config(overrides=["train.tensorboard=false", "train.progress_bar=false"])) == []


def test_writer_works_with_torch_and_tensorflow_blocked(tmp_path, repo_root):
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "tensorflow", "keras"):
                    raise ImportError(name + " is blocked in this test")
        sys.meta_path.insert(0, Blocker())
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_tensorboard_log import _train
        from hvdtrain.observability.tensorboard_log import read_scalars
        _train({str(tmp_path)!r})
        print(sorted(read_scalars({str(tmp_path)!r})))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "'step/loss'" in proc.stdout and "'epoch/val_accuracy'" in proc.stdout
