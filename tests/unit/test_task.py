"""hvdtrain.core.task: ArrayDataset, accuracy_from_sums and the TrainTask container."""

from __future__ import annotations

import numpy as np
import pytest

from hvdtrain.core.task import ArrayDataset, TrainTask, accuracy_from_sums


def _data(n: int = 10):
    inputs = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    targets = np.arange(n, dtype=np.int64) % 4
    return inputs, targets


def test_length_mismatch_is_rejected():
    inputs, targets = _data(10)
    with pytest.raises(ValueError) as err:
        ArrayDataset(inputs, targets[:7])
    assert "10" in str(err.value) and "7" in str(err.value)


def test_length():
    assert len(ArrayDataset(*_data(10))) == 10
    assert len(ArrayDataset(*_data(0))) == 0


def test_get_batch_without_transform():
    inputs, targets = _data(10)
    data = ArrayDataset(inputs, targets)
    indices = np.array([7, 2, 2, 9], dtype=np.int64)
    x, y = data.get_batch(indices, epoch=0)
    np.testing.assert_array_equal(x, inputs[indices])
    np.testing.assert_array_equal(y, targets[indices])
    assert x.shape == (4, 3) and y.shape == (4,)


def test_get_batch_with_transform():
    inputs, targets = _data(10)
    calls = []

    def transform(x, y, indices, epoch):
        calls.append((x.copy(), y.copy(), indices, epoch))
        return x * 2 + epoch, y + 1

    data = ArrayDataset(inputs, targets, transform=transform)
    indices = np.array([3, 0, 5], dtype=np.int64)
    x, y = data.get_batch(indices, epoch=4)
    np.testing.assert_array_equal(x, inputs[indices] * 2 + 4)
    np.testing.assert_array_equal(y, targets[indices] + 1)
    assert len(calls) == 1
    seen_x, seen_y, seen_indices, seen_epoch = calls[0]
    np.testing.assert_array_equal(seen_x, inputs[indices])
    np.testing.assert_array_equal(seen_y, targets[indices])
    np.testing.assert_array_equal(seen_indices, indices)
    assert seen_epoch == 4
    # the stored arrays are not modified by the transform
    np.testing.assert_array_equal(data.inputs, _data(10)[0])


@pytest.mark.parametrize("sums, accuracy", [
    ({"correct": 3, "count": 4}, 0.75),
    ({"correct": 0.0, "count": 10.0}, 0.0),
    ({"correct": 10.0, "count": 10.0}, 1.0),
    ({"correct": 7.0, "count": 8.0, "loss_sum": 3.0}, 0.875),
    ({"correct": 0.0, "count": 0.0}, 0.0),  # no samples: no division by zero
])
def test_accuracy_from_sums(sums, accuracy):
    assert accuracy_from_sums(sums) == {"accuracy": pytest.approx(accuracy)}


def test_train_task_defaults():
    data = ArrayDataset(*_data(4))
    task = TrainTask(model="m", optimizer="o", loss_fn=lambda out, y: 0.0, train_data=data, val_data=data,
                     metric_sums=lambda out, y: {})
    assert task.finalize_metrics is accuracy_from_sums
    assert task.info == {}
    other = TrainTask("m", "o", lambda out, y: 0.0, data, data, lambda out, y: {})
    other.info["x"] = 1
    assert task.info == {}  # not shared between instances
