"""model.freeze_backbone_epochs under kill-and-resume, in-process: the loop tells the adapter each
epoch before it trains it (``begin_epoch``, the resumed epoch included), so a run killed anywhere
and resumed freezes exactly the epochs an uninterrupted run freezes and ends bitwise equal to it.
The adapter here is the fast lane's NumPy one with its ``weight`` as the backbone and its ``bias``
as the head, frozen as the real adapters freeze (no update at all: no decay, no momentum)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_adapter import NumpyAdapter
from toyrun import Interrupt, StopAt, fit, without_timing

from hvdtrain.core import finetune

pytestmark = pytest.mark.resume


class FreezingAdapter(NumpyAdapter):
    """NumpyAdapter whose ``weight`` gets no update in the frozen epochs."""

    frozen = False

    def prepare(self, task, config):
        super().prepare(task, config)
        self.config, self.epochs_seen = config, []

    def begin_epoch(self, epoch):
        self.epochs_seen.append(epoch)
        self.frozen = finetune.backbone_frozen(self.config, epoch)

    def train_step(self, inputs, targets, apply_update=True, weight=None):
        kept = (self.model.params["weight"].copy(), self.velocity["weight"].copy()) if self.frozen else None
        loss = super().train_step(inputs, targets, apply_update, weight)
        if kept is not None and apply_update:
            self.model.params["weight"][...], self.velocity["weight"][...] = kept
        return loss


def weights(run, name):
    with np.load(run.checkpoints / name / "model.npz") as saved:
        return {k: saved[k] for k in saved.files}


@pytest.mark.parametrize("stop_at", [7, 12, 17, 25, 30])  # 12 steps/epoch: inside 1, epoch ends, inside 2 and 3
def test_frozen_epochs_are_exact_under_kill_and_resume(tmp_path, stop_at):
    overrides = ("train.epochs=3", "model.freeze_backbone_epochs=2", "checkpoint.every_steps=5",
                 "checkpoint.keep_last=100", "optim.weight_decay=0.01")
    reference = fit(tmp_path / "reference", *overrides, adapter=FreezingAdapter())
    assert reference.adapter.epochs_seen == [0, 1, 2]
    first, second, third = (weights(reference, f"epoch-000{i}") for i in (1, 2, 3))
    assert np.array_equal(first["weight"], second["weight"]) and not np.array_equal(second["weight"], third["weight"])
    assert not np.array_equal(first["bias"], second["bias"])  # the head trains while the backbone is frozen

    with pytest.raises(Interrupt):
        fit(tmp_path / "run", *overrides, callbacks=[StopAt(stop_at)], adapter=FreezingAdapter())
    resumed = fit(tmp_path / "run", *overrides, "checkpoint.resume=true", adapter=FreezingAdapter())
    assert resumed.adapter.epochs_seen == list(range(resumed.adapter.epochs_seen[0], 3))
    for name in reference.names():
        for key, value in weights(reference, name).items():
            assert value.tobytes() == weights(resumed, name)[key].tobytes(), f"{name}: {key}"
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())
