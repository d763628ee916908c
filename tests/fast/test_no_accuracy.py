"""A task without accuracy (regression, multi-label) reports its own metrics and no made-up accuracy."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy_adapter import N_CLASSES, N_FEATURES, RECIPE, LinearSoftmax, cross_entropy_sum, toy_data
from toyrun import fit

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
