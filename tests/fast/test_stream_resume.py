"""What resume means for a stream (docs/guides/own-data.md): the stream is read again from its start
and the run goes on at the next sample of the (seed, epoch) order, exactly as the same data in a
map-style Dataset; a world size is not refused. (At another world size: the same mechanism as every
random-access source, proven by the distributed resume tests.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy_adapter import N_CLASSES, N_FEATURES, RECIPE, LinearSoftmax, cross_entropy_sum, toy_data
from test_map_source import DictAdapter
from toyrun import Interrupt, StopAt, fit, without_timing

from hvdtrain.core.registry import register_recipe
from hvdtrain.core.sources import StreamSource
from hvdtrain.core.task import TrainTask

pytestmark = pytest.mark.resume


class Stream:
    """An iterable source as a torch IterableDataset is (by its class name), without torch; counts
    how often it was read from its start."""

    starts = 0

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __iter__(self):
        Stream.starts += 1
        return iter([{"features": self.x[i], "label": int(self.y[i])} for i in range(len(self.y))])


IterableDataset = type("IterableDataset", (Stream,), {})


@pytest.fixture
def stream_recipe():
    x_train, y_train, x_val, y_val = toy_data()

    @register_recipe(RECIPE, framework="torch", replace=True)
    def build(config: Any, ctx: Any) -> TrainTask:
        rng = np.random.default_rng(config.train.seed)
        model = LinearSoftmax({"weight": rng.normal(0.0, 0.1, (N_FEATURES, N_CLASSES)), "bias": np.zeros(N_CLASSES)})
        task = TrainTask(model=model, optimizer=None, loss_fn=cross_entropy_sum,
                         train_data=IterableDataset(x_train, y_train), val_data=IterableDataset(x_val, y_val),
                         metric_sums=lambda logits, y: {"correct": float((logits.argmax(axis=1) == y).sum())})
        assert isinstance(task.train_data, StreamSource) and not task.train_data.in_workers
        return task


def test_a_stream_resumes_at_the_next_sample_after_reading_it_again(tmp_path, stream_recipe):
    every = ("checkpoint.every_steps=5", "checkpoint.keep_last=100", "data.shuffle=true")
    reference = fit(tmp_path / "reference", *every, adapter=DictAdapter())
    with pytest.raises(Interrupt):
        fit(tmp_path / "run", *every, callbacks=[StopAt(13)], adapter=DictAdapter())
    before = Stream.starts
    resumed = fit(tmp_path / "run", *every, "checkpoint.resume=true", adapter=DictAdapter())
    assert Stream.starts == before + 2  # the resumed run read the train and val streams again, from the start
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())
    for k, v in reference.adapter.model.params.items():
        assert np.array_equal(resumed.adapter.model.params[k], v)
