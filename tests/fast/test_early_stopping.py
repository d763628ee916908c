"""Early stopping (``train.early_stopping``) in-process: the stop epoch, what metrics.jsonl and the
checkpoint say, kill-and-resume equality, the refusal to train past a stop, metric errors, and the
state across an elastic rollback.

Recipe ``toy`` reports ``val_score`` as scripted values (``register_toy_recipe(scores=...)``), so
each test chooses when the metric improves and when it plateaus.
"""

from __future__ import annotations

import pytest
from numpy_adapter import NumpyAdapter, register_toy_recipe
from toyrun import Interrupt, StopAt, fit, snapshot_tree, without_timing

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.config import ConfigError
from hvdtrain.core.loop import TrainingError

pytestmark = pytest.mark.resume

# val_score: best 0.6 at epoch 2, then flat: patience 3 stops after epoch 5 (12 optimizer steps an epoch)
PLATEAU = [0.5, 0.6, 0.6, 0.59, 0.6, 0.9, 0.9, 0.9, 0.9, 0.9]
WATCH = ("train.early_stopping=3", "train.early_stopping_metric=val_score")


class Ended(Callback):
    """Records that on_train_end ran (where the recipe's export runs) and with which result."""

    def __init__(self) -> None:
        self.results = []

    def on_train_end(self, result):
        self.results.append(result)


def test_stops_after_patience_epochs_without_improvement_and_ends_cleanly(tmp_path, capsys):
    register_toy_recipe(scores=PLATEAU)
    ended = Ended()
    run = fit(tmp_path, "train.epochs=10", *WATCH, callbacks=[ended])
    rows = run.metrics()
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["early_stopping"]["epochs_without_improvement"] for r in rows] == [0, 0, 1, 2, 3]
    last = rows[-1]["early_stopping"]
    assert last["stopped"] is True and last["best"] == 0.6 and last["best_epoch"] == 2
    assert last["metric"] == "val_score" and last["mode"] == "max" and last["patience"] == 3
    assert "val_score has not improved on 0.6 (epoch 2" in last["reason"] and "train.early_stopping=3" in last["reason"]
    assert not any(r["early_stopping"]["stopped"] for r in rows[:-1])
    # the final checkpoint is written as usual and its manifest says why the run stopped
    assert run.names()[-1] == "epoch-0005"
    assert run.manifest("epoch-0005")["metrics"]["early_stopping"]["stopped"] is True
    assert run.result.final["epoch"] == 5 and str(run.result.checkpoint).endswith("epoch-0005")
    assert len(ended.results) == 1 and ended.results[0] is run.result  # the export hook ran once
    out = capsys.readouterr().out
    stop_lines = [line for line in out.splitlines() if "early stopping" in line]
    assert stop_lines == ["hvdtrain: early stopping after epoch 5 of 10: " + last["reason"]]
    assert "hvdtrain: done toy/torch np=1 epochs=5/10 (stopped early)" in out


def test_min_delta_and_a_loss_metric_minimised_by_default(tmp_path):
    register_toy_recipe(scores=[0.50, 0.52, 0.53, 0.70, 0.70])
    run = fit(tmp_path / "delta", "train.epochs=5", "train.early_stopping=2", "train.early_stopping_metric=val_score",
              "train.early_stopping_min_delta=0.05")
    assert [r["epoch"] for r in run.metrics()] == [1, 2, 3]  # +0.02 and +0.03 are not improvements
    assert run.metrics()[-1]["early_stopping"]["best"] == 0.5
    # val_loss is minimised when the mode is unset (checkpoint.best_mode=max belongs to val_accuracy)
    register_toy_recipe()
    run = fit(tmp_path / "loss", "train.epochs=3", "train.early_stopping=1", "train.early_stopping_metric=val_loss")
    assert run.metrics()[-1]["early_stopping"]["mode"] == "min"


def test_off_by_default_and_the_records_stay_as_they_were(tmp_path):
    run = fit(tmp_path, "train.epochs=2")
    assert all("early_stopping" not in r for r in run.metrics())


@pytest.mark.parametrize("kill_step, every", [(41, 0), (41, 5)], ids=["at-an-epoch-checkpoint", "mid-epoch"])
def test_kill_and_resume_stops_after_the_same_epoch_as_an_uninterrupted_run(tmp_path, kill_step, every):
    overrides = ("train.epochs=10", *WATCH, f"checkpoint.every_steps={every}", "checkpoint.keep_last=100")
    register_toy_recipe(scores=PLATEAU)
    whole = fit(tmp_path / "whole", *overrides)
    register_toy_recipe(scores=PLATEAU)
    with pytest.raises(Interrupt):  # killed in epoch 4, after epoch 3 left one epoch without improvement
        fit(tmp_path / "killed", *overrides, callbacks=[StopAt(kill_step)])
    register_toy_recipe(scores=PLATEAU[3:])  # the resumed run's evaluations: epochs 4, 5, ...
    resumed = fit(tmp_path / "killed", *overrides, "checkpoint.resume=true")
    assert [r["epoch"] for r in resumed.metrics()] == [1, 2, 3, 4, 5]
    assert without_timing(resumed.metrics()) == without_timing(whole.metrics())


def test_a_stopped_run_is_not_trained_past_its_stop_by_more_epochs(tmp_path, capsys):
    register_toy_recipe(scores=PLATEAU)
    fit(tmp_path, "train.epochs=10", *WATCH)
    before = snapshot_tree(tmp_path)
    with pytest.raises(TrainingError) as refused:
        fit(tmp_path, "train.epochs=20", *WATCH, "checkpoint.resume=true")
    message = str(refused.value)
    assert "\n" not in message and "train.epochs=20" in message and "stopped early after epoch 5" in message
    assert "raise train.early_stopping above 3 or set train.early_stopping=none" in message
    assert "nothing was changed" in message
    assert snapshot_tree(tmp_path) == before
    # the same epochs: finished, as a completed run's resume is (no training; the export runs again)
    capsys.readouterr()
    ended = Ended()
    again = fit(tmp_path, "train.epochs=10", *WATCH, "checkpoint.resume=true", callbacks=[ended])
    assert [r["epoch"] for r in again.metrics()] == [1, 2, 3, 4, 5] and len(ended.results) == 1
    assert "stopped early after epoch 5" in capsys.readouterr().out and again.names()[-1] == "epoch-0005"


@pytest.mark.parametrize("continuing, epochs", [
    (("train.early_stopping=5", "train.early_stopping_metric=val_score"), [6, 7]),  # more patience: 2 more bad epochs
    (("train.early_stopping=none",), [6, 7, 8]),  # off: to train.epochs
])
def test_a_stopped_run_trains_on_deliberately(tmp_path, continuing, epochs):
    register_toy_recipe(scores=PLATEAU)
    fit(tmp_path, "train.epochs=8", *WATCH)
    register_toy_recipe(scores=[0.6, 0.6, 0.6])
    run = fit(tmp_path, "train.epochs=8", *continuing, "checkpoint.resume=true")
    assert [r["epoch"] for r in run.metrics()][5:] == epochs


def test_a_metric_the_run_does_not_report_is_refused_naming_the_ones_it_has(tmp_path):
    with pytest.raises(TrainingError) as typo:  # knowable only once an epoch was evaluated
        fit(tmp_path / "typo", "train.epochs=3", "train.early_stopping=2", "train.early_stopping_metric=val_acuracy")
    message = str(typo.value)
    assert "train.early_stopping_metric='val_acuracy'" in message and "\n" not in message
    assert "train_loss, val_loss, val_accuracy" in message
    assert not (tmp_path / "typo" / "metrics.jsonl").exists() and not (tmp_path / "typo" / "checkpoints").exists()
    # a value that is not the same on every worker: refused before training
    with pytest.raises(ConfigError, match="train.early_stopping_metric='samples_per_sec'.*every worker agrees on"):
        fit(tmp_path / "local", "train.early_stopping=2", "train.early_stopping_metric=samples_per_sec")
    assert not (tmp_path / "local").exists()
    # at a resume, the history says which metrics there are: refused before training
    fit(tmp_path / "resumed", "train.epochs=1")
    before = snapshot_tree(tmp_path / "resumed")
    with pytest.raises(TrainingError, match="'val_f1' is not among this run's metrics; use one of: train_loss, "
                                            "val_loss, val_accuracy"):
        fit(tmp_path / "resumed", "train.epochs=2", "train.early_stopping=1", "train.early_stopping_metric=val_f1",
            "checkpoint.resume=true")
    assert snapshot_tree(tmp_path / "resumed") == before


exceptions = pytest.importorskip("horovod.common.exceptions")


class FailingAdapter(NumpyAdapter):
    """Fails once before update ``fail_before`` as a lost worker's collective does (elastic rollback)."""

    def __init__(self, fail_before: int) -> None:
        super().__init__()
        self.updates, self.fail_before, self.rollbacks = 0, fail_before, 0

    def train_step(self, inputs, targets, apply_update=True, weight=None):
        if apply_update and self.fail_before == self.updates + 1:
            self.fail_before = None
            raise exceptions.HorovodInternalError("injected collective failure")
        self.updates += int(apply_update)
        return super().train_step(inputs, targets, apply_update, weight)

    def snapshot(self):
        return super().snapshot(), self.updates

    def restore_snapshot(self, snapshot):
        inner, self.updates = snapshot
        super().restore_snapshot(inner)
        self.rollbacks += 1

    def elastic_reset(self):
        pass


@pytest.mark.elastic
def test_an_elastic_rollback_keeps_the_early_stopping_state(tmp_path):
    pytest.importorskip("horovod.common.elastic")
    overrides = ("train.epochs=10", *WATCH, "train.elastic=true", "train.elastic_commit_every=5")
    register_toy_recipe(scores=PLATEAU)
    whole = fit(tmp_path / "whole", *overrides)
    register_toy_recipe(scores=PLATEAU)
    adapter = FailingAdapter(fail_before=44)  # in epoch 4: back to the commit at update 40
    rolled = fit(tmp_path / "rolled", *overrides, adapter=adapter)
    assert adapter.rollbacks == 1
    assert [r["epoch"] for r in rolled.metrics()] == [1, 2, 3, 4, 5]
    # the rolled-back epoch is retrained on other random streams (a re-form reseeds); the stop is the same
    assert [r["early_stopping"] for r in rolled.metrics()] == [r["early_stopping"] for r in whole.metrics()]
