"""Data as users have it (hvdtrain.core.sources): map-style torch Datasets collated like default_collate,
Hugging Face datasets by columns, and the kinds refused when the task is built."""

from __future__ import annotations

import numpy as np
import pytest
from envguard import isolate_environ

from hvdtrain.core.sources import ACCEPTED, ColumnSource, MapSource, SourceError, as_source, collate
from hvdtrain.core.task import ArrayDataset, TrainTask


@pytest.fixture
def framework_env(monkeypatch):
    """Importing OpenCV (through TensorFlow's image stack) extends LD_LIBRARY_PATH."""
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR", "LD_LIBRARY_PATH"))


def task(data):
    return TrainTask(model=None, optimizer=None, loss_fn=None, train_data=data, val_data=data, metric_sums=None)


def as_numpy(value):
    """torch's default_collate output with tensors as NumPy, for comparison."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {k: as_numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_numpy(v) for v in value]
    return value


def assert_same(a, b):
    assert type(a) is type(b) or isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_a_torch_dataset_is_collated_like_default_collate(framework_env):
    torch = pytest.importorskip("torch")

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            x = torch.arange(3, dtype=torch.float32) + i
            return {"inputs": {"x": x, "pair": (torch.tensor([i, i]), float(i) / 2)}, "mask": i % 2 == 0,
                    "label": i % 3}

    data = Rows()
    indices = np.array([4, 1, 7])
    items = [data[int(i)] for i in indices]
    assert_same(collate(items), as_numpy(torch.utils.data.default_collate(items)))
    source = task(data).train_data
    assert isinstance(source, MapSource) and source.source is data and len(source) == 10
    inputs, targets = source.get_batch(indices, epoch=0)
    assert list(inputs) == ["inputs", "mask"] and targets.tolist() == [1, 1, 1] and targets.dtype == np.int64
    np.testing.assert_array_equal(inputs["inputs"]["x"][:, 0], [4.0, 1.0, 7.0])


def test_tuple_items_are_inputs_and_target(framework_env):
    torch = pytest.importorskip("torch")
    data = torch.utils.data.TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
    inputs, targets = as_source(data).get_batch(np.array([5, 0]), 0)
    np.testing.assert_array_equal(inputs, [[10.0, 11.0], [0.0, 1.0]])
    assert targets.tolist() == [5, 0]


def test_a_hugging_face_dataset_is_read_by_columns():
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"input_ids": [[i, i + 1, i + 2] for i in range(8)],
                                        "attention_mask": [[1, 1, 0]] * 8, "text": [f"t{i}" for i in range(8)],
                                        "label": list(range(8))})
    source = as_source(table, inputs=["input_ids", "attention_mask"])
    assert isinstance(source, ColumnSource) and len(source) == 8
    inputs, targets = source.get_batch(np.array([6, 2]), 1)
    assert list(inputs) == ["input_ids", "attention_mask"]
    np.testing.assert_array_equal(inputs["input_ids"], [[6, 7, 8], [2, 3, 4]])
    assert targets.tolist() == [6, 2]
    with pytest.raises(SourceError, match=r"^TrainTask.train_data: columns \['labelz'\] are not in"):
        as_source(table, target="labelz")


def test_mapping_items_without_a_target_column_are_refused_by_name():
    rows = [{"x": np.zeros(2), "y": 1}] * 4
    with pytest.raises(SourceError, match=r"^TrainTask.train_data: items are mappings with keys \['x', 'y'\] and "
                                          r"no target column label or labels"):
        as_source(rows).get_batch(np.array([0, 1]), 0)
    inputs, targets = as_source(rows, target="y").get_batch(np.array([0, 1]), 0)
    assert list(inputs) == ["x"] and targets.tolist() == [1, 1]


def test_an_array_dataset_is_used_as_it_is():
    data = ArrayDataset(np.zeros((4, 2)), np.zeros(4))
    assert task(data).train_data is data


def refused(data, *expected):
    with pytest.raises(SourceError) as err:
        task(data)
    message = str(err.value)
    assert "\n" not in message and message.endswith("accepted: " + ACCEPTED) or "Accepted: " + ACCEPTED in message
    for part in expected:
        assert part in message
    return message


def test_a_batched_or_endless_tf_data_is_refused_naming_what_to_pass(framework_env):
    tf = pytest.importorskip("tensorflow")
    rows = tf.data.Dataset.from_tensor_slices((np.zeros((30, 3), np.float32), np.zeros(30, np.int64)))
    refused(rows.batch(2), "TrainTask.train_data: a tf.data.Dataset and batched: its len() counts batches",
            "pass it before .batch() (or call .unbatch())")
    refused(rows.repeat(), "TrainTask.train_data: a tf.data.Dataset that never ends (.repeat())")


def test_loaders_generators_and_dicts_are_refused_naming_what_is_accepted(framework_env):
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4)))
    refused(loader, "torch.utils.data.dataloader.DataLoader batches and shuffles itself; pass its dataset")
    refused((i for i in range(3)), "builtins.generator is not a dataset")
    refused({"x": [1, 2]}, "builtins.dict is not a dataset")
