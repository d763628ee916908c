"""train.nonfinite: a NaN gradient stops the run naming the step (error) or drops the update (skip).

The NaN comes from the data: recipe toy's ``nan_samples`` are NaN in epoch ``nan_epoch``. With
``data.shuffle=false`` the epoch's order is the samples' order, so sample ``8 * k + j`` is read by
micro-batch ``k + 1`` of the epoch (batches of 8, 12 per epoch).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from numpy_adapter import NumpyAdapter, load_weights, register_toy_recipe
from toyrun import fit

from hvdtrain.core.adapter import NonFiniteGradientError
from hvdtrain.core.loop import TrainingError

pytestmark = pytest.mark.nonfinite


def test_error_stops_naming_the_step_and_writes_no_checkpoint_for_it(tmp_path):
    register_toy_recipe(nan_samples=[8 * 4 + 3], nan_epoch=1)  # epoch 2, batch 5: optimizer step 12 + 5
    with pytest.raises(TrainingError, match=r"\bstep 17\b") as stopped:
        fit(tmp_path, "data.shuffle=false", "checkpoint.every_steps=4", "checkpoint.keep_last=100")
    assert "epoch 2" in str(stopped.value)
    written = [p for p in (tmp_path / "checkpoints").iterdir()]
    assert sorted(p.name for p in written) == ["epoch-0001", "step-00000004", "step-00000008", "step-00000016"]
    for path in written:  # nothing at or after the bad step, nothing half-written
        assert not path.name.startswith(".")
        assert int(json.loads((path / "manifest.json").read_text())["step"]) <= 16
    metrics = [line for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(metrics) == 1  # epoch 1 only


def test_error_on_the_first_step_leaves_no_checkpoint(tmp_path):
    register_toy_recipe(nan_samples=[0], nan_epoch=0)
    with pytest.raises(TrainingError, match=r"\bstep 1\b"):
        fit(tmp_path, "data.shuffle=false", "checkpoint.every_steps=1")
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


@pytest.mark.parametrize("accumulation, skipped", [(1, 2), (2, 2)])
def test_skip_drops_the_updates_and_counts_them(tmp_path, accumulation, skipped):
    register_toy_recipe(nan_samples=[8 * 4 + 3, 8 * 9], nan_epoch=1)  # epoch 2, batches 5 and 10
    run = fit(tmp_path, "data.shuffle=false", "train.nonfinite=skip", f"train.grad_accumulation={accumulation}")
    first, second = run.metrics()
    assert "skipped_updates" not in first and second["skipped_updates"] == skipped
    assert run.result.final["skipped_updates"] == skipped
    assert len(run.adapter.applied_lrs) == 2 * 12 // accumulation - skipped  # the others were applied
    assert all(np.isfinite(a).all() for a in load_weights(run.result.checkpoint).values())
    assert math.isfinite(second["val_loss"])
    assert run.names() == ["epoch-0001", "epoch-0002"]


def test_skip_without_bad_gradients_reports_nothing(tmp_path):
    run = fit(tmp_path, "train.nonfinite=skip")
    assert all("skipped_updates" not in r for r in run.metrics())
    assert len(run.adapter.applied_lrs) == 24
    assert not re.search("skipped", (tmp_path / "metrics.jsonl").read_text())


def test_the_nan_fault_read_when_training_starts(tmp_path, monkeypatch):
    """HVDTRAIN_FAULT set after hvdtrain was imported still fires: the callback reads it at the start."""
    register_toy_recipe()
    monkeypatch.setenv("HVDTRAIN_FAULT", "nan:step=5")
    run = fit(tmp_path, "train.nonfinite=skip")
    assert run.metrics()[0]["skipped_updates"] == 1
    assert len(run.adapter.applied_lrs) == 24 - 1


class OverflowingAdapter(NumpyAdapter):
    """A kernel that overflowed: after its second update one weight is infinite (the gradient was finite)."""

    def train_step(self, inputs, targets, apply_update=True, weight=None):
        loss = super().train_step(inputs, targets, apply_update, weight)
        if len(self.applied_lrs) == 2:
            next(iter(self.model.params.values())).flat[0] = np.inf
        return loss


def test_a_model_that_overflowed_is_never_checkpointed(tmp_path):
    """save_state refuses infinite weights: the run stops naming the step and the checkpoint, and
    the checkpoints written before are all that is there."""
    register_toy_recipe()
    with pytest.raises(TrainingError, match=r"not finite at optimizer step 2; refusing to write checkpoint "
                                            r"step-00000002"):
        fit(tmp_path, "checkpoint.every_steps=1", adapter=OverflowingAdapter())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001"]


class LateFiniteCheck(NumpyAdapter):
    """Finds a non-finite gradient two updates after it came, as a GPU's deferred check does
    (hvdtrain.torch.finite; its own logic: tests/unit/test_deferred_finite_check.py)."""

    bad_at, updates = None, 0

    def train_step(self, inputs, targets, apply_update=True, weight=None):
        try:
            loss = super().train_step(inputs, targets, apply_update, weight)
        except NonFiniteGradientError:  # noted, not raised (this toy skips the update meanwhile)
            self.bad_at, loss = self.updates, 0.0
        self.updates += int(apply_update)
        if self.bad_at is not None and self.updates - self.bad_at == 3:
            raise NonFiniteGradientError("found late", updates_ago=2)
        return loss


def test_a_late_finding_names_the_bad_optimizer_step_not_the_one_that_found_it(tmp_path):
    register_toy_recipe(nan_samples=[8 * 4 + 3], nan_epoch=1)  # optimizer step 17, found at step 19
    with pytest.raises(TrainingError, match=r"found late at epoch 2, batch 7 \(optimizer step 17\)"):
        fit(tmp_path, "data.shuffle=false", adapter=LateFiniteCheck())
