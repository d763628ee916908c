"""Iterable sources (issue 38, item 1): a torch IterableDataset and an unbatched tf.data.Dataset are
read once into memory on every rank, sample i being the stream's i-th element; from there they are
random-access sources (the order from (seed, epoch), exact resume at any world size). A stream
that does not fit (hvdtrain.core.streams.LIMIT_BYTES) or yields nothing is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from envguard import isolate_environ

from hvdtrain.core import dataset_check, streams
from hvdtrain.core.sources import SourceError, StreamSource, as_source
from hvdtrain.core.task import TrainTask


@pytest.fixture
def framework_env(monkeypatch):
    """Importing OpenCV (through TensorFlow's image stack) extends LD_LIBRARY_PATH."""
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR", "LD_LIBRARY_PATH"))


def arrays(n=30):
    x = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
    return x, np.arange(n, dtype=np.int64) % 3


def torch_stream(x, y):
    import torch

    class Rows(torch.utils.data.IterableDataset):  # dict items, as a user writes them
        def __iter__(self):
            for features, label in zip(torch.from_numpy(x), y):
                yield {"features": features, "label": int(label)}

    return Rows()


def test_a_torch_iterable_dataset_is_read_in_its_order(framework_env):
    pytest.importorskip("torch")
    x, y = arrays()
    task = TrainTask(model=None, optimizer=None, loss_fn=None, train_data=torch_stream(x, y),
                     val_data=torch_stream(x[:8], y[:8]), metric_sums=None)
    assert isinstance(task.train_data, StreamSource) and len(task.train_data) == 30 and len(task.val_data) == 8
    inputs, targets = task.train_data.get_batch(np.array([7, 2, 29]), epoch=0)
    assert list(inputs) == ["features"] and np.array_equal(inputs["features"], x[[7, 2, 29]])
    assert targets.dtype == np.int64 and np.array_equal(targets, y[[7, 2, 29]])


def test_an_unbatched_tf_data_is_read_in_its_order(framework_env):
    tf = pytest.importorskip("tensorflow")
    x, y = arrays()
    source = as_source(tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2, b)))
    assert len(source) == 30
    inputs, targets = source.get_batch(np.array([3, 0]), epoch=1)
    assert np.array_equal(inputs, x[[3, 0]] * 2) and np.array_equal(targets, y[[3, 0]])


def test_ranks_that_read_different_streams_are_caught_by_the_data_check(framework_env):
    pytest.importorskip("torch")
    x, y = arrays()
    same, again = as_source(torch_stream(x, y)), as_source(torch_stream(x, y))
    sharded = as_source(torch_stream(x[1::2], y[1::2]))  # as ds.shard(2, 1) would give rank 1
    reordered = as_source(torch_stream(x[::-1].copy(), y[::-1].copy()))
    assert same.fingerprint() == again.fingerprint()
    assert len({same.fingerprint(), sharded.fingerprint(), reordered.fingerprint()}) == 3
    records = [{"host": "a", "train": dataset_check.describe(same), "val": (0, None)},
               {"host": "a", "train": dataset_check.describe(reordered), "val": (0, None)}]
    assert "rank" in dataset_check.compare(records)


def test_a_stream_too_large_for_memory_is_refused_naming_the_alternatives(framework_env, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(streams, "LIMIT_BYTES", 100)  # 20 bytes an element
    x, y = arrays()
    with pytest.raises(SourceError) as err:
        as_source(torch_stream(x, y), "val_data")
    message = str(err.value)
    assert "\n" not in message and message.startswith("TrainTask.val_data: ")
    assert "holds more than" in message and "map-style torch.utils.data.Dataset" in message
    with pytest.raises(SourceError, match="yielded no elements"):
        as_source(torch_stream(x[:0], y[:0]))
