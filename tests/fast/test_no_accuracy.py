"""A task without accuracy (regression, multi-label) reports its own metrics and no made-up accuracy; a task
without validation data trains, keeps its best checkpoint by train_loss, and refuses keys that need validation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy_adapter import N_CLASSES, N_FEATURES, RECIPE, LinearSoftmax, cross_entropy_sum, toy_data
from toyrun import fit

from hvdtrain.core.config import ConfigError
from hvdtrain.core.registry import register_recipe
from hvdtrain.core.task import ArrayDataset, TrainTask, accuracy_from_sums


def test_a_task_without_accuracy_reports_its_own_metrics(tmp_path, capsys):
    x_train, y_train, x_val, y_val = toy_data()

    @register_recipe(RECIPE, framework="torch", replace=True)
    def build(config: Any, ctx: Any) -> TrainTask:
        model = LinearSoftmax({"weight": np.zeros((N_FEATURES, N_CLASSES)), "bias": np.zeros(N_CLASSES)})
        return TrainTask(model=model, optimizer=None, loss_fn=cross_entropy_sum, train_data=ArrayDataset(x_train, y_train),
                         val_data=ArrayDataset(x_val, y_val),
                         metric_sums=lambda logits, y: {"top_logit": float(logits.max(axis=1).sum())},
                         finalize_metrics=lambda sums: {"top_logit": sums["top_logit"] / sums["count"]})

    run = fit(tmp_path, "train.epochs=1")
    record = run.metrics()[0]
    assert "val_accuracy" not in record and record["val_top_logit"] > 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch 1:"))
    assert "accuracy" not in line and "nan" not in line and f"val_top_logit {record['val_top_logit']:.4f}" in line


def test_the_default_finalize_makes_up_no_accuracy():
    assert accuracy_from_sums({"loss_sum": 3.0, "count": 4.0}) == {}
    assert accuracy_from_sums({"correct": 3.0, "count": 4.0}) == {"accuracy": 0.75}


def no_validation_recipe(x_train, y_train):
    @register_recipe(RECIPE, framework="torch", replace=True)
    def build(config: Any, ctx: Any) -> TrainTask:
        rng = np.random.default_rng(config.train.seed)
        model = LinearSoftmax({"weight": rng.normal(0.0, 0.1, (N_FEATURES, N_CLASSES)), "bias": np.zeros(N_CLASSES)})
        return TrainTask(model=model, optimizer=None, loss_fn=cross_entropy_sum, train_data=ArrayDataset(x_train, y_train),
                         val_data=None, metric_sums=lambda logits, y: {})


def test_a_task_without_validation_trains_and_keeps_its_best_checkpoint_by_train_loss(tmp_path, capsys):
    x_train, y_train, _, _ = toy_data()
    no_validation_recipe(x_train, y_train)
    run = fit(tmp_path, "train.epochs=3", "checkpoint.keep_last=1", "train.early_stopping=5",
              "train.early_stopping_metric=train_loss")
    records = run.metrics()
    assert len(records) == 3 and not any(k.startswith("val_") for r in records for k in r)
    out = capsys.readouterr().out
    assert "the best checkpoint kept is the one with the lowest train_loss" in out and "nan" not in out
    best = min(records, key=lambda r: r["train_loss"])
    kept = {run.manifest(name)["metrics"]["epoch"] for name in run.names()}
    assert best["epoch"] in kept  # the best by train_loss survives keep_last=1


@pytest.mark.parametrize("overrides, refused", [
    (["train.early_stopping=2"], "checkpoint.best_metric=val_accuracy (train.early_stopping=2): the task has no "
                                 "validation data"),
    (["checkpoint.best_metric=val_loss"], "checkpoint.best_metric=val_loss: the task has no validation data"),
])
def test_keys_that_need_validation_are_refused_by_name_without_it(tmp_path, overrides, refused):
    x_train, y_train, _, _ = toy_data()
    no_validation_recipe(x_train, y_train)
    with pytest.raises(ConfigError, match="^" + refused.replace("(", r"\(").replace(")", r"\)")):
        fit(tmp_path, *overrides)
