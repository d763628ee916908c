"""hvdtrain.keras's pieces that need no job (one process, Horovod on Gloo, size 1): ``shard`` keeps
``Dataset.shard``'s elements, ``batches`` orders an epoch by (seed, epoch) alone, ``WarmUp``'s values
and config, ``DistributedOptimizer`` keeps the user's object and class name and refuses what it cannot
run, and ``Checkpoints`` writes an epoch folder, restores it exactly, and refuses to overwrite (also in a
``fit`` without ``restore``) or to load another model's. The 2-rank run is tests/distributed/test_keras_fit.py."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
hvd = pytest.importorskip("horovod.tensorflow")

import hvdtrain.keras as hk  # noqa: E402
from hvdtrain.core.checkpoint import CheckpointError  # noqa: E402


@pytest.fixture(autouse=True)
def horovod(monkeypatch):
    monkeypatch.setenv("HOROVOD_CONTROLLER", "gloo")  # a single process without horovodrun
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "gloo")
    hvd.init()


def test_shard_keeps_the_elements_dataset_shard_keeps():
    x, y = np.arange(11 * 2).reshape(11, 2), np.arange(11)
    for rank in range(3):
        want = [int(v) for v in tf.data.Dataset.from_tensor_slices(y).shard(3, rank).as_numpy_iterator()]
        sx, sy = hk.shard((x, y), rank=rank, size=3)
        assert sy.tolist() == want and sx[:, 1].tolist() == [2 * v + 1 for v in want]
        assert hk.shard({"a": y}, rank=rank, size=3)["a"].tolist() == want
        assert [int(v) for v in hk.shard(tf.data.Dataset.from_tensor_slices(y), rank, 3).as_numpy_iterator()] == want
    assert hk.shard(y).tolist() == y.tolist()  # Horovod's rank and size: 0 of 1
    with pytest.raises(TypeError, match="shard: list is not"):
        hk.shard([1, 2, 3])
    with pytest.raises(ValueError, match=r"different lengths \[3, 4\]"):
        hk.shard((np.zeros(3), np.zeros(4)))
    with pytest.raises(ValueError, match="rank=3, size=3"):
        hk.shard(y, rank=3, size=3)


def test_batches_order_an_epoch_by_seed_and_epoch_alone():
    x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10)
    data, steps = hk.batches(x, y, batch_size=3, seed=5)
    assert steps == 3  # the 10th row waits for another epoch's order
    epochs = [b[1].tolist() for b in data.take(3 * steps).as_numpy_iterator()]
    resumed, _ = hk.batches(x, y, batch_size=3, seed=5, initial_epoch=1)
    assert [b[1].tolist() for b in resumed.take(2 * steps).as_numpy_iterator()] == epochs[steps:]
    for e in range(3):
        rows = sum(epochs[e * steps:(e + 1) * steps], [])
        assert len(set(rows)) == 9
    assert epochs[:steps] != epochs[steps:2 * steps]  # reshuffled each epoch
    other, _ = hk.batches(x, y, batch_size=3, seed=6)
    assert [b[1].tolist() for b in other.take(steps).as_numpy_iterator()] != epochs[:steps]
    plain, _ = hk.batches(x, batch_size=5, shuffle=False)
    assert [b[0][:, 0].tolist() for b in plain.take(2).as_numpy_iterator()] == [[0, 2, 4, 6, 8], [10, 12, 14, 16, 18]]
    with pytest.raises(ValueError, match="batch_size=11 needs"):
        hk.batches(x, y, batch_size=11)


def test_warm_up_ramps_to_the_schedule_and_round_trips():
    cosine = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=100)
    warm = hk.WarmUp(cosine, warmup_steps=10, start=0.01)
    for step in (0, 5, 9, 10, 50):
        after = float(cosine(step))
        want = 0.01 + (after - 0.01) * step / 10 if step < 10 else after
        assert float(warm(step)) == pytest.approx(want, rel=1e-6)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(warm))
    assert isinstance(again.after, keras.optimizers.schedules.CosineDecay)
    assert [float(again(s)) for s in (3, 30)] == [float(warm(s)) for s in (3, 30)]
    assert float(hk.WarmUp(0.2, 4)(2)) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="warmup_steps=0"):
        hk.WarmUp(0.1, 0)


def test_distributed_optimizer_is_the_users_object_under_its_own_name():
    schedule = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=10)
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=0.01)
    wrapped = hk.DistributedOptimizer(optimizer)
    assert wrapped is optimizer and isinstance(wrapped, keras.optimizers.AdamW)
    assert type(wrapped).__name__ == "AdamW" and wrapped.learning_rate is not None
    assert keras.saving.serialize_keras_object(wrapped)["class_name"] == "AdamW"
    with pytest.raises(ValueError, match="already distributed"):
        hk.DistributedOptimizer(optimizer)
    with pytest.raises(TypeError, match="str is not a Keras 3 optimizer"):
        hk.DistributedOptimizer("adam")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with pytest.raises(ValueError, match="LossScaleOptimizer"):
            hk.DistributedOptimizer(keras.optimizers.SGD())
        assert isinstance(hk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())),
                          keras.optimizers.LossScaleOptimizer)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _model(units=4):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), keras.layers.Dense(2)])
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    return model


def test_checkpoints_restore_exactly_and_never_overwrite(tmp_path):
    x, y = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32), np.ones((16, 2), np.float32)
    model, checkpoints = _model(), hk.Checkpoints(tmp_path / "ckpt")
    assert checkpoints.restore(model, resume=True) == 0  # nothing there yet
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[checkpoints])
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch-0001", "epoch-0002"]

    fresh = _model()
    with pytest.raises(CheckpointError, match="already holds checkpoint epoch-0002"):
        hk.Checkpoints(tmp_path / "ckpt").restore(fresh, resume=False)
    assert hk.Checkpoints(tmp_path / "ckpt").restore(fresh, resume=True) == 2
    for a, b in zip(model.variables + model.optimizer.variables, fresh.variables + fresh.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    assert int(fresh.optimizer.iterations.numpy()) == 8

    with pytest.raises(CheckpointError, match="already holds checkpoint epoch-0002"):  # fit without restore()
        fresh.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[hk.Checkpoints(tmp_path / "ckpt")])
    with pytest.raises(CheckpointError, match="has shape"):  # another model's: refused, nothing loaded
        hk.Checkpoints(tmp_path / "ckpt").restore(_model(units=5), resume=True)


def test_metric_average_leaves_a_single_worker_alone():
    logs = {"loss": 0.5, "val_accuracy": 0.25}
    hk.MetricAverageCallback().on_epoch_end(0, logs)
    assert logs == {"loss": 0.5, "val_accuracy": 0.25}
