"""TensorFlowAdapter.convert_batch: the prefetch thread hands the step tensors (the same values and
dtypes the step made itself), and pipeline stages the batch as loaded."""

from __future__ import annotations

import threading

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hvdtrain.core.prefetch import prefetch  # noqa: E402
from hvdtrain.tensorflow.adapter import TensorFlowAdapter  # noqa: E402


def test_arrays_and_dicts_of_arrays_become_tensors_of_the_same_values_and_dtypes():
    adapter = TensorFlowAdapter()
    images = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    labels = np.array([3, 7], dtype=np.int64)
    inputs, targets = adapter.convert_batch(images, labels)
    assert isinstance(inputs, tf.Tensor) and isinstance(targets, tf.Tensor)
    assert inputs.dtype == tf.float32 and targets.dtype == tf.int64
    np.testing.assert_array_equal(inputs.numpy(), images)
    np.testing.assert_array_equal(targets.numpy(), labels)
    assert len(targets) == 2  # the loop counts samples with len()
    tokens = {"input_ids": np.array([[101, 7, 102]], np.int32), "attention_mask": np.ones((1, 3), np.int32)}
    inputs, _ = adapter.convert_batch(tokens, labels[:1])
    assert sorted(inputs) == ["attention_mask", "input_ids"]
    assert all(isinstance(v, tf.Tensor) and v.dtype == tf.int32 for v in inputs.values())
    np.testing.assert_array_equal(inputs["input_ids"].numpy(), tokens["input_ids"])


def test_in_the_prefetch_thread():
    adapter = TensorFlowAdapter()
    batches = [(np.full((2, 2), i, np.float32), np.array([i, i])) for i in range(4)]
    out = list(prefetch(range(4), lambda i: (threading.current_thread().name, *adapter.convert_batch(*batches[i])), 2))
    assert [name for name, _, _ in out] == ["hvdtrain-prefetch"] * 4
    assert [int(y.numpy()[0]) for _, _, y in out] == [0, 1, 2, 3]


def test_pipeline_stages_take_the_batch_as_loaded():
    adapter = TensorFlowAdapter()
    adapter.pipeline = object()  # a GPipe driver: it cuts micro-batches from the loaded batch
    images, labels = np.zeros((2, 3), np.float32), np.array([0, 1])
    inputs, targets = adapter.convert_batch(images, labels)
    assert inputs is images and targets is labels
