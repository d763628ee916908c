"""train.max_steps: stop after N optimizer updates (counted across resumes), whichever of epochs and
max_steps comes first; a stop inside an epoch evaluates, records and checkpoints the epoch so far
at its position in the data, and a resume from there continues from the next sample exactly.
hvdtrain's LR schedule spans the updates the run will take (its decay ends at the stop)."""

from __future__ import annotations

import math

import pytest
from test_kill_and_resume import assert_same_checkpoint
from toyrun import Interrupt, StopAt, fit, without_timing

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.config import ConfigError
from hvdtrain.core.schedule import LRSchedule

pytestmark = pytest.mark.resume

# recipe toy: 96 samples in batches of 8, 12 optimizer updates per epoch


class Updates(Callback):
    """The LR and optimizer step of every update, as the loop reports them."""

    def __init__(self):
        self.lrs, self.steps = [], []

    def on_step_end(self, epoch, step, logs):
        self.lrs.append(logs["lr"])
        self.steps.append(logs["global_step"])


def test_a_stop_inside_an_epoch_checkpoints_there(tmp_path):
    seen = Updates()
    run = fit(tmp_path, "train.epochs=3", "train.max_steps=17", "checkpoint.keep_last=100", callbacks=[seen])
    assert seen.steps == list(range(1, 18))
    assert run.names() == ["epoch-0001", "step-00000017"]
    manifest = run.manifest("step-00000017")
    # one epoch completed, 5 updates of 8 samples into the second one's order
    assert (manifest["epoch"], manifest["consumed"], manifest["step"]) == (1, 40, 17)
    rows = run.metrics()
    assert [(r["epoch"], r["step"]) for r in rows] == [(1, 12), (2, 17)] and "val_loss" in rows[-1]
    assert run.result.checkpoint == run.checkpoints / "step-00000017"
    assert manifest["metrics"]["step"] == 17  # the epoch so far was evaluated before the checkpoint


@pytest.mark.parametrize("epochs, max_steps, updates, names", [
    (1, 100, 12, ["epoch-0001"]),  # the epochs end first
    (3, 24, 24, ["epoch-0001", "epoch-0002"]),  # the limit falls on an epoch's end: an epoch checkpoint
    (2, None, 24, ["epoch-0001", "epoch-0002"]),  # no limit: epochs only
])
def test_the_smaller_of_epochs_and_max_steps_wins(tmp_path, epochs, max_steps, updates, names):
    seen = Updates()
    run = fit(tmp_path, f"train.epochs={epochs}", f"train.max_steps={'null' if max_steps is None else max_steps}",
              "checkpoint.keep_last=100", callbacks=[seen])
    assert seen.steps[-1] == updates and run.names() == names
    assert len(run.result.history) == math.ceil(updates / 12)


def test_gradient_accumulation_counts_updates_not_micro_batches(tmp_path):
    seen = Updates()
    run = fit(tmp_path, "train.epochs=2", "train.grad_accumulation=3", "train.max_steps=5", callbacks=[seen])
    assert len(seen.steps) == 15 and seen.steps[-1] == 5  # 5 updates of 3 micro-batches
    assert run.manifest("step-00000005")["consumed"] == 5 * 3 * 8 - 96


def test_hvdtrain_schedule_decays_to_its_floor_at_max_steps(tmp_path):
    seen = Updates()
    fit(tmp_path, "train.epochs=3", "train.max_steps=17", "optim.warmup_epochs=0", "optim.decay=cosine",
        "optim.min_lr_ratio=0.1", callbacks=[seen])
    expected = LRSchedule(base_lr=0.05, peak_lr=0.05, warmup_steps=0, total_steps=17, decay="cosine", min_lr_ratio=0.1)
    assert seen.lrs == [expected(k) for k in range(17)]
    assert seen.lrs[-1] == pytest.approx(0.005)


def test_killed_inside_a_max_steps_run_and_resumed_is_exact(tmp_path):
    overrides = ("train.epochs=3", "train.max_steps=17", "checkpoint.every_steps=5", "checkpoint.keep_last=100")
    reference = fit(tmp_path / "reference", *overrides)
    with pytest.raises(Interrupt):
        fit(tmp_path / "run", *overrides, callbacks=[StopAt(16)])
    resumed = fit(tmp_path / "run", *overrides, "checkpoint.resume=true")
    assert resumed.names() == reference.names()
    for name in reference.names():
        assert_same_checkpoint(resumed.checkpoints / name, reference.checkpoints / name)
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())


def test_a_run_stopped_by_max_steps_goes_on_from_the_next_sample(tmp_path):
    # a constant LR: the schedule does not depend on where the run stops, so going on from step 17
    # to 30 must give exactly the uninterrupted 30-update run
    constant = ("train.epochs=3", "optim.warmup_epochs=0", "optim.decay=constant", "checkpoint.keep_last=100")
    reference = fit(tmp_path / "reference", *constant, "train.max_steps=30")
    fit(tmp_path / "run", *constant, "train.max_steps=17")
    seen = Updates()
    resumed = fit(tmp_path / "run", *constant, "train.max_steps=30", "checkpoint.resume=true", callbacks=[seen])
    assert seen.steps == list(range(18, 31))
    assert_same_checkpoint(resumed.checkpoints / "step-00000030", reference.checkpoints / "step-00000030")
    # what ran: the stopped run's evaluation of epoch 2 at step 17 stays, then the whole epoch's row
    rows = without_timing(resumed.metrics())
    assert [(r["epoch"], r["step"]) for r in rows] == [(1, 12), (2, 17), (2, 24), (3, 30)]
    assert rows[:1] + rows[2:] == without_timing(reference.metrics())


def test_resuming_a_run_that_reached_max_steps_trains_nothing(tmp_path, capsys):
    fit(tmp_path, "train.epochs=3", "train.max_steps=17")
    seen = Updates()
    again = fit(tmp_path, "train.epochs=3", "train.max_steps=17", "checkpoint.resume=true", callbacks=[seen])
    assert seen.steps == [] and [r["step"] for r in again.result.history] == [12, 17]  # its rows kept
    out = capsys.readouterr().out
    assert "train.max_steps=17 already reached" in out and "steps=17 (train.max_steps)" in out


def test_max_steps_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="train.max_steps"):
        fit(tmp_path, "train.max_steps=0")
