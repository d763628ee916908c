"""Which checkpoints a run writes and keeps: step cadence, keep_last, the best checkpoint."""

from __future__ import annotations

import pytest
from numpy_adapter import register_toy_recipe
from toyrun import fit

pytestmark = pytest.mark.checkpoint

# recipe toy: 96 samples in batches of 8, 12 micro-batches per epoch


@pytest.mark.parametrize("every, accumulation, steps", [
    (5, 1, [5, 10, 15, 20]),
    (6, 1, [6, 18]),  # steps 12 and 24 end an epoch: an epoch checkpoint only, no step one beside it
    (2, 2, [2, 4, 8, 10]),  # 6 optimizer steps per epoch of 2 micro-batches each
])
def test_step_checkpoints_at_every_steps(tmp_path, every, accumulation, steps):
    run = fit(tmp_path, f"checkpoint.every_steps={every}", f"train.grad_accumulation={accumulation}",
              "checkpoint.keep_last=100")
    assert run.names() == ["epoch-0001", "epoch-0002", *(f"step-{s:08d}" for s in steps)]
    per_epoch = 12 // accumulation
    for s in steps:
        manifest = run.manifest(f"step-{s:08d}")
        assert (manifest["kind"], manifest["step"]) == ("step", s)
        # where in the data it stands: completed epochs, then samples of the next epoch consumed
        assert (manifest["epoch"], manifest["consumed"]) == (s // per_epoch, (s % per_epoch) * 8 * accumulation)
    for epoch in (1, 2):
        manifest = run.manifest(f"epoch-{epoch:04d}")
        assert (manifest["kind"], manifest["epoch"], manifest["consumed"], manifest["step"]) == (
            "epoch", epoch, 0, epoch * per_epoch)


def test_no_step_checkpoints_by_default_and_none_when_disabled(tmp_path):
    assert fit(tmp_path / "default", "checkpoint.keep_last=100").names() == ["epoch-0001", "epoch-0002"]
    assert fit(tmp_path / "disabled", "checkpoint.enabled=false").names() == []


def test_keep_last_prunes_older_checkpoints(tmp_path):
    run = fit(tmp_path, "train.epochs=3", "checkpoint.every_steps=5", "checkpoint.keep_last=2",
              "checkpoint.best_metric=null")
    # written: 5, 10, epoch-1, 15, 20, epoch-2, 25, 30, 35, epoch-3 (36); kept: the newest two by progress
    assert run.names() == ["epoch-0003", "step-00000035"]
    assert run.aside() == []  # pruned folders are deleted, not left behind
    assert run.result.checkpoint == run.checkpoints / "epoch-0003"


@pytest.mark.parametrize("mode, scores, best", [
    ("max", [0.2, 0.9, 0.1, 0.3, 0.4], 2),
    ("min", [0.5, 0.6, 0.05, 0.3, 0.4], 3),
])
def test_best_checkpoint_is_kept_beyond_keep_last(tmp_path, mode, scores, best):
    register_toy_recipe(scores=scores)  # the evaluations report val_score = these, in turn
    run = fit(tmp_path, "train.epochs=5", "checkpoint.keep_last=2", "checkpoint.best_metric=val_score",
              f"checkpoint.best_mode={mode}")
    assert run.names() == [f"epoch-{best:04d}", "epoch-0004", "epoch-0005"]
    assert run.manifest(f"epoch-{best:04d}")["metrics"]["val_score"] == scores[best - 1]
    assert [r["val_score"] for r in run.metrics()] == scores


def test_best_is_not_kept_when_it_is_among_the_last(tmp_path):
    register_toy_recipe(scores=[0.1, 0.2, 0.3, 0.4])
    run = fit(tmp_path, "train.epochs=4", "checkpoint.keep_last=2", "checkpoint.best_metric=val_score")
    assert run.names() == ["epoch-0003", "epoch-0004"]
