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


def test_shard_keeps_the_elements_dataset_shard_keeps_of_an_equal_part():
    x, y = np.arange(11 * 2).reshape(11, 2), np.arange(11)
    for rank in range(3):
        dealt = tf.data.Dataset.from_tensor_slices(y[:9])  # the 11 % 3 = 2 left over are left out
        want = [int(v) for v in dealt.shard(3, rank).as_numpy_iterator()]
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


def test_shard_gives_every_worker_as_many_elements(capsys):
    """issue 61, item 5: 4,097 samples on 2 workers were 2,049 and 2,048, so rank 0 ran a step more at
    the epoch's end and waited there forever; now every worker gets 2,048 (the last sample left out,
    rank 0 says so in one line), from arrays and from a dataset alike."""
    y = np.arange(4097)
    shares = [hk.shard(y, rank=r, size=2) for r in range(2)]
    datasets = [list(hk.shard(tf.data.Dataset.from_tensor_slices(y), r, 2).as_numpy_iterator()) for r in range(2)]
    for share in (shares, datasets):
        assert [len(s) for s in share] == [2048, 2048]
        assert sorted(np.concatenate(share).tolist()) == list(range(4096))
    batched = [hk.shard(tf.data.Dataset.from_tensor_slices(y), r, 2).batch(64) for r in range(2)]
    assert [len(list(b)) for b in batched] == [32, 32]  # the same number of steps
    notes = capsys.readouterr().err.splitlines()
    assert notes.count("hvdtrain: note: shard: 4,097 rows on 2 workers: the last 1 left out, so that every worker "
                       "gets 2,048 and all take the same number of steps") == 1  # rank 0 only
    assert len(notes) == 3 and notes[1].startswith("hvdtrain: note: shard: 4,097 elements on 2 workers")
    assert hk.shard({"a": np.arange(6)}, rank=1, size=3)["a"].tolist() == [1, 4]  # even: nothing left out
    assert capsys.readouterr().err == ""
    endless = hk.shard(tf.data.Dataset.range(5).repeat(), 1, 2)  # repeat(): dealt as it is
    assert [int(v) for v in endless.take(4)] == [1, 3, 0, 2]
    known = tf.data.Dataset.range(7).filter(lambda v: v >= 0).apply(tf.data.experimental.assert_cardinality(7))
    assert [int(v) for v in hk.shard(known, 0, 2)] == [0, 2, 4]


def test_shard_refuses_a_dataset_ordered_per_process_or_of_unknown_length():
    """issue 61, item 5: hk.shard(ds.shuffle(...).batch(...)) gave the workers overlapping shares (each
    its own permutation); a dataset reordered upstream of the shard point, or whose length tf.data
    cannot tell (no equal shares), is refused in one line saying what to do."""
    from hvdtrain.core.config import ConfigError

    rows = tf.data.Dataset.range(10)
    reordered = [
        (r"_ShuffleDataset: shuffle\(\)", rows.shuffle(10).batch(2)),  # the review's hk.shard(ds.shuffle().batch())
        (r"_ShuffleDataset: shuffle\(\)", tf.data.Dataset.zip((rows, rows.shuffle(10, seed=1)))),
        (r"_RandomDataset: Dataset.random\(\)", tf.data.Dataset.sample_from_datasets([rows, rows])),
        (r"_ParallelMapDataset: map\(\.\.\., deterministic=False\)",
         rows.map(lambda v: v + 1, num_parallel_calls=2, deterministic=False)),
    ]
    for why, dataset in reordered:
        with pytest.raises(ConfigError, match=rf"^shard: the dataset is reordered before the shard point \({why}.*\), "
                                              rf"so each worker .*; shard first, then shuffle"):
            hk.shard(dataset, 0, 2)
    options = tf.data.Options()
    options.deterministic = False
    with pytest.raises(ConfigError, match="^shard: the dataset's options set deterministic=False"):
        hk.shard(rows.with_options(options), 0, 2)
    with pytest.raises(ConfigError, match=r"^shard: tf.data cannot tell the dataset's length \(cardinality UNKNOWN.*"
                                          r"assert_cardinality\(N\)\), or shard the file names$"):
        hk.shard(rows.filter(lambda v: v % 3 > 0), 0, 2)
    assert [int(v) for v in hk.shard(rows, 1, 2).shuffle(5, seed=0)] != []  # shard first, then shuffle: fine


def _rewrite_checksummed(folder, name, payload):
    """``folder/name`` replaced by ``payload`` with its manifest's SHA-256 updated: damage the
    checksums cannot see (a crafted or miswritten checkpoint)."""
    import hashlib
    import json

    (folder / name).write_bytes(payload)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = hashlib.sha256(payload).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_restore_of_a_checksummed_but_malformed_checkpoint_is_one_checkpoint_error(tmp_path):
    """issue 63, item 13: files that match their checksums but are not what they claim (a truncated
    .npz, one whose paths are numbers, one holding text where the weights are numbers) are a
    one-line CheckpointError naming the checkpoint (the text one was NumPy's bare "could not convert
    string to float" before). That every rank raises it, none left waiting for rank 0's broadcast,
    is tests/distributed/test_keras_fit.py's 2-rank job."""
    import io

    x, y = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32), np.ones((8, 2), np.float32)
    model = _model()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[hk.Checkpoints(tmp_path / "ckpt")])
    folder = tmp_path / "ckpt" / "epoch-0001"
    whole = (folder / "optimizer.npz").read_bytes()
    numbers, words = io.BytesIO(), io.BytesIO()
    with np.load(folder / "model_variables.npz", allow_pickle=False) as saved:
        arrays = {k: saved[k] for k in saved.files}
    np.savez(numbers, **{**arrays, "paths": np.arange(len(arrays) - 1)})
    first = sorted(k for k in arrays if k != "paths")[0]
    np.savez(words, **{**arrays, first: np.full(arrays[first].shape, "w")})  # the right shape, text for numbers
    for name, payload in (("optimizer.npz", whole[:len(whole) // 2]), ("model_variables.npz", numbers.getvalue()),
                          ("model_variables.npz", words.getvalue())):
        _rewrite_checksummed(folder, name, payload)
        with pytest.raises(CheckpointError) as refused:
            hk.Checkpoints(tmp_path / "ckpt").restore(_model(), resume=True)
        message = str(refused.value)
        assert str(folder) in message and "\n" not in message, message
