"""Saving a TensorFlow checkpoint a variable at a time: ``optimizer.npz``/``model.npz`` are the file
``np.savez`` wrote (same members, stored, same values), and a sharded run's rank 0 holds no slot's
values after :meth:`ShardedOptimizer.collect` until the saver asks for it, in the file's order (one
process, Horovod (Gloo) of size 1; the 2- and 4-rank files are compared with data parallelism's in
tests/distributed/test_sharded_optimizer_tf.py)."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
hvd = pytest.importorskip("horovod.tensorflow")

from hvdtrain.tensorflow import sharded  # noqa: E402
from hvdtrain.tensorflow.checkpoint import save_variables  # noqa: E402


def test_the_file_is_what_np_savez_wrote(tmp_path):
    variables = [tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4), name="kernel"),
                 tf.Variable(np.arange(5), name="count"), tf.Variable(2.5, name="scalar")]
    save_variables(tmp_path / "streamed.npz", variables)
    arrays = {f"v{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(variables)}
    arrays["paths"] = np.asarray([v.path if hasattr(v, "path") else v.name for v in variables], dtype=np.str_)
    with open(tmp_path / "savez.npz", "wb") as f:
        np.savez(f, **arrays)

    def members(name):
        return [(i.filename, i.compress_type, i.file_size) for i in zipfile.ZipFile(tmp_path / name).infolist()]

    assert members("streamed.npz") == members("savez.npz")
    with np.load(tmp_path / "streamed.npz") as got, np.load(tmp_path / "savez.npz") as want:
        for key in want.files:
            assert got[key].dtype == want[key].dtype
            np.testing.assert_array_equal(got[key], want[key])


@pytest.fixture
def optimizer(monkeypatch):
    """A sharded AdamW (size 1) over a two-layer model in buckets of 16 elements (a kernel cut at its
    rows, each bucket's slice a shard variable), after one update: its slots are not zero."""
    monkeypatch.setenv("HOROVOD_CONTROLLER", "gloo")  # a single process without horovodrun (MPI's singleton
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "gloo")  # start fails without mpirun's helpers here)
    hvd.init()
    monkeypatch.setattr(sharded, "BUCKET_ELEMENTS", 16)
    model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    recipe = keras.optimizers.AdamW(learning_rate=0.1, weight_decay=0.01)
    zero = sharded.ShardedOptimizer(recipe, recipe, model.trainable_variables, "optimizer")
    assert len(zero.shards) == sum(len(g.buckets) for g in zero.groups) > len(zero.groups)
    zero.apply([tf.random.stateless_normal(s.shape, seed=(1, i)) for i, s in enumerate(zero.shards)])
    return zero


def test_the_root_brings_each_slot_when_the_saver_asks_in_the_files_order(optimizer):
    optimizer.collect()
    hosts = [v for v in optimizer.checkpoint_variables() if isinstance(v, sharded.HostValue)]
    assert hosts and all(h.value is None for h in hosts)  # nothing brought yet
    with pytest.raises(RuntimeError, match=f"expected {hosts[0].path}"):
        hosts[1].numpy()
    expected = {}
    for g, group in enumerate(optimizer.groups):
        for name in optimizer.slot_names:  # one process: the whole buffer is the bucket slices in order
            whole = np.concatenate([optimizer.slots[(g, b, name)].numpy() for b in range(len(group.buckets))])
            for i, value in enumerate(group.split_host(whole)):
                expected[(g, i, name)] = value
    for host in hosts:
        (g, i), name, _ = optimizer._host_of[id(host)]
        value = host.numpy()
        assert value.shape == host.shape
        np.testing.assert_array_equal(value, expected[(g, i, name)])
        assert np.any(value != 0) or value.size == 0
    optimizer.release()
    with pytest.raises(RuntimeError, match="not collected"):
        hosts[0].numpy()


def test_release_brings_what_the_saver_did_not_ask_for(optimizer):
    optimizer.collect()
    hosts = [v for v in optimizer.checkpoint_variables() if isinstance(v, sharded.HostValue)]
    hosts[0].numpy()  # a save that failed after its first slot
    optimizer.release()  # the rest still comes (on other ranks the collectives wait for it)
    assert optimizer._pending == [] and all(h.value is None and h.fetch is None for h in hosts)
