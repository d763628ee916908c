"""Wrappers that time a training run from outside: when each batch was ready, when each step ran.

Used by the benchmark workers that split a step's wall time into waiting for data and computing
(``pipeline.py``, ``image_e2e.py``). They wrap the dataset and the adapter a recipe built, so the
trainer runs unchanged.
"""

from __future__ import annotations

import time


class TimedDataset:
    """Wraps a dataset; records when each batch finished loading (in the loader's thread).

    Every other attribute (``image_size``, ``channels``, ...) is the wrapped dataset's."""

    def __init__(self, inner):
        self.inner, self.ready = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def get_batch(self, indices, epoch):
        batch = self.inner.get_batch(indices, epoch)
        self.ready.append(time.perf_counter())
        return batch


class TimedAdapter:
    """Wraps an adapter; records when each training step started and ended."""

    def __init__(self, inner):
        self.inner, self.starts, self.ends = inner, [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def train_step(self, *args, **kwargs):
        self.starts.append(time.perf_counter())
        loss = self.inner.train_step(*args, **kwargs)
        self.ends.append(time.perf_counter())
        return loss
