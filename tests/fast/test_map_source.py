"""A map-style dataset (``len()`` and ``data[i]``, read through hvdtrain.core.sources.MapSource) keeps the
loop's guarantees: the same order as the same data in an ArrayDataset, and an exact kill-and-resume."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy_adapter import N_CLASSES, N_FEATURES, RECIPE, LinearSoftmax, NumpyAdapter, cross_entropy_sum, toy_data
from toyrun import Interrupt, StopAt, fit, without_timing

from hvdtrain.core.registry import register_recipe
from hvdtrain.core.sources import MapSource
from hvdtrain.core.task import TrainTask

pytestmark = pytest.mark.resume


class Rows:
    """Map-style data as a torch Dataset has it: one ``{"features": ..., "label": ...}`` item per index."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y, self.reads = x, y, 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Any]:
        self.reads += 1
        return {"features": self.x[i], "label": int(self.y[i])}


class DictAdapter(NumpyAdapter):
    """The NumPy adapter for dict inputs (``{"features": x}``): what a model(**inputs) receives."""

    def train_step(self, inputs, targets, apply_update=True, weight=None):
        return super().train_step(inputs["features"], targets, apply_update, weight)

    def eval_step(self, inputs, targets):
        return super().eval_step(inputs["features"], targets)


@pytest.fixture
def map_recipe():
    x_train, y_train, x_val, y_val = toy_data()

    @register_recipe(RECIPE, framework="torch", replace=True)
    def build(config: Any, ctx: Any) -> TrainTask:
        rng = np.random.default_rng(config.train.seed)
        model = LinearSoftmax({"weight": rng.normal(0.0, 0.1, (N_FEATURES, N_CLASSES)), "bias": np.zeros(N_CLASSES)})
        task = TrainTask(model=model, optimizer=None, loss_fn=cross_entropy_sum, train_data=Rows(x_train, y_train),
                         val_data=Rows(x_val, y_val),
                         metric_sums=lambda logits, y: {"correct": float((logits.argmax(axis=1) == y).sum())})
        assert isinstance(task.train_data, MapSource)
        return task


def test_a_map_style_dataset_trains_exactly_as_the_same_arrays(tmp_path, map_recipe):
    source = fit(tmp_path / "map", "data.shuffle=true", adapter=DictAdapter())
    from numpy_adapter import register_toy_recipe

    register_toy_recipe()  # the same data as an ArrayDataset
    arrays = fit(tmp_path / "arrays", "data.shuffle=true")
    assert without_timing(source.metrics()) == without_timing(arrays.metrics())
    for k, v in arrays.adapter.model.params.items():
        assert np.array_equal(source.adapter.model.params[k], v)


@pytest.mark.parametrize("stop_at", [7, 17])
def test_a_map_style_dataset_resumes_exactly(tmp_path, map_recipe, stop_at):
    every = ("checkpoint.every_steps=5", "checkpoint.keep_last=100")
    reference = fit(tmp_path / "reference", *every, adapter=DictAdapter())
    with pytest.raises(Interrupt):
        fit(tmp_path / "run", *every, callbacks=[StopAt(stop_at)], adapter=DictAdapter())
    resumed = fit(tmp_path / "run", *every, "checkpoint.resume=true", adapter=DictAdapter())
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())
    for k, v in reference.adapter.model.params.items():
        assert np.array_equal(resumed.adapter.model.params[k], v)
