"""The loop hands every loaded batch, training and evaluation, to the adapter's ``convert_batch``
in the prefetch thread, and the steps get what it returned (TensorFlow makes its tensors there,
off the loop's thread; hvdtrain.core.prefetch)."""

from __future__ import annotations

import threading

import numpy as np
from numpy_adapter import NumpyAdapter
from toyrun import fit, without_timing


class Converted(np.ndarray):
    """An array ``convert_batch`` made (the steps check they receive only these)."""


class Recording(NumpyAdapter):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.received: list[bool] = []

    def convert_batch(self, inputs, targets):
        self.threads.append(threading.current_thread().name)
        return inputs.view(Converted), targets

    def train_step(self, inputs, targets, apply_update=True, weight=None):
        self.received.append(isinstance(inputs, Converted))
        return super().train_step(np.asarray(inputs), targets, apply_update, weight)

    def eval_step(self, inputs, targets):
        self.received.append(isinstance(inputs, Converted))
        return super().eval_step(np.asarray(inputs), targets)


def test_every_batch_is_converted_in_the_prefetch_thread_and_trains_the_same(tmp_path):
    adapter = Recording()
    run = fit(tmp_path / "converted", "train.epochs=2", adapter=adapter)
    plain = fit(tmp_path / "plain", "train.epochs=2")
    assert adapter.received and all(adapter.received)
    assert len(adapter.threads) == len(adapter.received)  # each batch once
    assert set(adapter.threads) == {"hvdtrain-prefetch"}
    assert without_timing(run.metrics()) == without_timing(plain.metrics())


def test_loaded_inline_they_are_converted_on_the_loops_thread(tmp_path):
    adapter = Recording()
    fit(tmp_path / "inline", "data.prefetch_batches=0", adapter=adapter)
    assert adapter.received and all(adapter.received)
    assert set(adapter.threads) == {threading.current_thread().name}
