"""Where a run starts: refusals that change nothing, a resume with nothing to resume, damaged checkpoints."""

from __future__ import annotations

import re

import numpy as np
import pytest
from numpy_adapter import load_weights
from toyrun import fit, snapshot_tree, without_timing

from hvdtrain.core.loop import TrainingError

pytestmark = pytest.mark.resume


def test_checkpoints_without_resume_are_refused_and_nothing_changes(tmp_path):
    fit(tmp_path, "train.epochs=1")
    before = snapshot_tree(tmp_path)
    with pytest.raises(TrainingError, match="--resume") as refused:
        fit(tmp_path, "train.epochs=2")
    assert "epoch-0001" in str(refused.value) and "nothing was changed" in str(refused.value)
    assert snapshot_tree(tmp_path) == before


def test_resume_with_nothing_to_resume_starts_from_scratch_with_a_note(tmp_path, capsys):
    resumed = fit(tmp_path / "resumed", "checkpoint.resume=true")
    assert "scratch" in capsys.readouterr().err
    fresh = fit(tmp_path / "fresh")
    assert [r["epoch"] for r in resumed.metrics()] == [1, 2]
    assert without_timing(resumed.metrics()) == without_timing(fresh.metrics())
    for name, array in load_weights(fresh.result.checkpoint).items():
        assert np.array_equal(load_weights(resumed.result.checkpoint)[name], array)


def test_resume_across_a_setting_that_does_not_define_the_state_continues(tmp_path):
    fit(tmp_path, "train.epochs=1")
    resumed = fit(tmp_path, "train.epochs=2", "checkpoint.resume=true", "optim.lr=0.01")
    assert [r["epoch"] for r in resumed.metrics()] == [1, 2]
    assert resumed.names() == ["epoch-0001", "epoch-0002"]
    assert resumed.adapter.applied_lrs and len(resumed.adapter.applied_lrs) == 12  # only epoch 2 was trained


@pytest.mark.parametrize("key, value", [("train.batch_size", 16), ("optim.name", "adam"),
                                        ("train.grad_accumulation", 2),
                                        # the samples of the epoch's order and their order (issue 22, item 7)
                                        ("train.seed", 7), ("data.shuffle", "false"), ("data.remainder", "drop"),
                                        ("data.max_train_samples", 64), ("data.path", "/elsewhere")])
def test_resume_across_a_state_defining_change_is_refused_naming_the_key(tmp_path, key, value):
    fit(tmp_path, "train.epochs=1")
    before = snapshot_tree(tmp_path)
    with pytest.raises(TrainingError, match=re.escape(key)) as refused:
        fit(tmp_path, "train.epochs=2", "checkpoint.resume=true", f"{key}={value}")
    assert "nothing was changed" in str(refused.value)
    assert snapshot_tree(tmp_path) == before


def _damage(path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # same length, one byte flipped in the middle
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
def test_damaged_latest_checkpoint_is_moved_aside_and_the_previous_one_used(tmp_path, capsys, how):
    reference = fit(tmp_path / "reference", "train.epochs=3")
    run = fit(tmp_path / "run", "train.epochs=3")
    _damage(run.checkpoints / "epoch-0003" / "model.npz", how)
    capsys.readouterr()

    resumed = fit(tmp_path / "run", "train.epochs=3", "checkpoint.resume=true")
    err = capsys.readouterr().err
    assert "epoch-0003" in err and "model.npz" in err  # the damaged checkpoint and file are named
    aside = [name for name in resumed.aside() if "epoch-0003" in name]
    assert len(aside) == 1, resumed.aside()  # kept for inspection, out of the way
    assert resumed.names() == ["epoch-0001", "epoch-0002", "epoch-0003"]
    # it continued from epoch-0002: epoch 3 trained again, exactly as the uninterrupted run did
    assert len(resumed.adapter.applied_lrs) == 12
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())
    for name, array in load_weights(reference.checkpoints / "epoch-0003").items():
        assert np.array_equal(load_weights(resumed.checkpoints / "epoch-0003")[name], array)


def test_every_checkpoint_damaged_starts_from_scratch_with_a_note(tmp_path, capsys):
    run = fit(tmp_path, "train.epochs=1")
    _damage(run.checkpoints / "epoch-0001" / "model.npz", "truncated")
    capsys.readouterr()
    resumed = fit(tmp_path, "train.epochs=1", "checkpoint.resume=true")
    err = capsys.readouterr().err
    assert "epoch-0001" in err and "scratch" in err
    assert resumed.names() == ["epoch-0001"] and len(resumed.aside()) == 1
    assert [r["epoch"] for r in resumed.result.history] == [1]


def test_a_resume_from_scratch_starts_metrics_afresh(tmp_path):
    run = fit(tmp_path, "train.epochs=1")
    before = (tmp_path / "metrics.jsonl").read_text()
    _damage(run.checkpoints / "epoch-0001" / "model.npz", "truncated")
    resumed = fit(tmp_path, "train.epochs=1", "checkpoint.resume=true")
    assert [r["epoch"] for r in resumed.metrics()] == [1]
    assert (tmp_path / "metrics.jsonl.abandoned-1").read_text() == before  # kept, out of the way
