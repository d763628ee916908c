"""hvdtrain.keras's pieces that need no job (one process, Horovod on Gloo, size 1): ``shard`` keeps
``Dataset.shard``'s elements, ``batches`` orders an epoch by (seed, epoch) alone and with
``global_batch_size`` gives the workers the parts of the same global batches at any world size, ``WarmUp``'s values
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


def test_a_global_batch_is_the_same_rows_at_any_world_size():
    x, y = np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20)

    def global_batches(size, initial_epoch=0):  # the workers' parts of each global batch, joined in rank order
        parts = []
        for rank in range(size):
            data, steps = hk.batches(x, y, global_batch_size=8, seed=3, initial_epoch=initial_epoch, rank=rank,
                                     size=size)
            assert steps == 2  # 20 // 8 on every worker at every world size; the last 4 rows wait for another epoch
            parts.append([b[1].tolist() for b in data.take((3 - initial_epoch) * steps).as_numpy_iterator()])
            assert all(len(batch) == 8 // size for batch in parts[-1])
        return [sum((part[i] for part in parts), []) for i in range(len(parts[0]))]

    one = global_batches(1)
    assert global_batches(2) == one and global_batches(4) == one
    assert global_batches(2, initial_epoch=1) == one[2:]  # resumed at epoch 1 on another world size
    assert len(set(one[0] + one[1])) == 16 and one[:2] != one[2:4]  # each epoch its own permutation
    alone, _ = hk.batches(x, y, batch_size=8, seed=3)  # one worker: the per-worker form's batches
    assert [b[1].tolist() for b in alone.take(6).as_numpy_iterator()] == one

    per_worker = [[b[1].tolist() for b in hk.batches(*hk.shard((x, y), rank=r, size=2), batch_size=4, seed=3)[0]
                   .take(2).as_numpy_iterator()] for r in range(2)]
    assert [sorted(a + b) for a, b in zip(*per_worker)] != [sorted(batch) for batch in one[:2]]  # shard: other rows

    with pytest.raises(ValueError, match=r"^batches: global_batch_size=6 cannot be shared equally by 4 workers; "
                                         r"launch 1, 2, 3, 6 workers \(the world sizes that divide 6\), or change "
                                         r"global_batch_size$"):
        hk.batches(x, y, global_batch_size=6, rank=0, size=4)
    with pytest.raises(ValueError, match=r"^batches: batch_size=4 \(per worker\) and global_batch_size=8 \(all "
                                         r"workers together\) exclude each other; give one of them$"):
        hk.batches(x, y, 4, global_batch_size=8)
    with pytest.raises(ValueError, match="global_batch_size=21 needs 1 <= global_batch_size <= the 20 rows"):
        hk.batches(x, y, global_batch_size=21)
    with pytest.raises(ValueError, match="rank=0, size=2 go with global_batch_size only"):
        hk.batches(x, y, batch_size=4, rank=0, size=2)


def test_distributed_optimizer_takes_the_exchange_keys_and_refuses_like_the_cli():
    """The config keys of the exchange, checked like prepare()'s: Trainer-only keys by name, a key
    contradicting Horovod's compression=/op= naming both, the rulebook's lines; a refused optimizer
    stays the user's plain object."""
    from hvdtrain.core.config import ConfigError

    sgd = keras.optimizers.SGD(0.1)
    refused = [
        (dict(parallel__shard_optimizer="gradients"), r"^parallel\.shard_optimizer='gradients' is Trainer-only \("),
        (dict(train__reproducible="world-size"), r"^train\.reproducible='world-size' is Trainer-only"),
        (dict(parallel__pipeline_stages=2), r"^parallel\.pipeline_stages=2 is Trainer-only"),
        (dict(optim__grad_clip_norm=1.0), r"^optim\.grad_clip_norm=1\.0 is not a DistributedOptimizer setting "
                                          r"\(pass clipnorm or global_clipnorm"),
        (dict(compression=hvd.Compression.fp16, comm__compression="powersgd"),
         r"^compression=hvd\.Compression\.fp16 contradicts comm\.compression='powersgd'; set one of them$"),
        (dict(compression=hvd.Compression.none, train__fp16_allreduce=True),
         r"^compression=hvd\.Compression\.none contradicts train\.fp16_allreduce=True; set one of them$"),
        (dict(op=hvd.Adasum, comm__reduction="average"), r"^op=hvd\.Adasum contradicts comm\.reduction='average'"),
        (dict(op=hvd.Sum), r"op=.* is not one of hvd\.Average or hvd\.Adasum"),
        (dict(op=hvd.Adasum, comm__compression="topk"),  # the rulebook's own line, both keys named
         r"comm\.compression=topk cannot be combined with comm\.reduction=adasum"),
        (dict(comm__local_sgd_steps=4, comm__compression="powersgd"),
         r"comm\.local_sgd_steps=4 .* cannot be combined with comm\.compression=powersgd"),
        (dict(comm__compression="zip"), r"comm\.compression"),
    ]
    for kwargs, message in refused:
        with pytest.raises(ConfigError, match=message):
            hk.DistributedOptimizer(sgd, **kwargs)
        assert type(sgd) is keras.optimizers.SGD  # untouched
    with pytest.raises(ConfigError, match=r"^gradient_accumulation_steps=2 .* cannot be combined with "
                                          r"comm\.compression='powersgd'"):
        hk.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=2), comm__compression="powersgd")
    with pytest.raises(ConfigError, match=r"^LossScaleOptimizer \(the Trainer's train.mixed_precision=fp16\): "
                                          r"comm\.compression=topk keeps error-feedback buffers"):
        hk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), comm__compression="topk")
    # agreeing spellings are one setting
    hk.DistributedOptimizer(keras.optimizers.SGD(), compression=hvd.Compression.fp16, comm__compression="fp16")
    hk.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Average, comm__compression="topk")


def _fit_powersgd(directory, epochs, resume=False, **keys):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(2)])
    optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(0.02, momentum=0.5), **keys)
    model.compile(optimizer=optimizer, loss="mse")
    checkpoints = hk.Checkpoints(directory)
    start = checkpoints.restore(model, resume=resume)
    x = np.random.default_rng(0).normal(size=(32, 6)).astype(np.float32)
    y = np.stack([x[:, 0] - x[:, 1], x[:, 2]], 1)
    history = model.fit(x, y, batch_size=8, epochs=epochs, initial_epoch=start, shuffle=False, verbose=0,
                        callbacks=[checkpoints])
    return model, optimizer, history


def test_powersgd_runs_in_the_optimizer_and_its_state_resumes_exactly(tmp_path):
    """comm__compression='powersgd' in model.fit: the exchange is hvdtrain's PowerSGD (its counter
    counts the updates; tests/distributed/test_keras_fit.py compares it with plain allreduce and a
    hand-written loop), Checkpoints keep its error feedback and Q (comm_state.npz), and a run
    resumed from epoch 2 ends with the uninterrupted run's weights bit for bit."""
    from hvdtrain.tensorflow.compression import PowerSGD
    from hvdtrain.tensorflow.keras_exchange import exchange_of

    keys = dict(comm__compression="powersgd", comm__powersgd_rank=1, comm__powersgd_min_size=0)
    model, optimizer, history = _fit_powersgd(tmp_path / "whole", 4, **keys)
    exchange = exchange_of(optimizer)
    assert isinstance(exchange, PowerSGD) and int(exchange.steps.numpy()) == 4 * 4
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0], history.history["loss"]
    with np.load(tmp_path / "whole" / "epoch-0002" / "comm_state.npz", allow_pickle=False) as saved:
        assert {"0/steps", "0/q/0", "0/error/0", "0/q/2", "0/error/2"} <= set(saved.files)
        assert int(saved["0/steps"]) == 8

    import shutil

    shutil.copytree(tmp_path / "whole" / "epoch-0002", tmp_path / "stopped" / "epoch-0002")  # stopped after epoch 2
    resumed, again, _ = _fit_powersgd(tmp_path / "stopped", 4, resume=True, **keys)
    assert int(exchange_of(again).steps.numpy()) == 16
    for a, b in zip(model.variables + optimizer.variables, resumed.variables + again.variables):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
