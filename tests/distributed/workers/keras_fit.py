"""Worker of tests/distributed/test_keras_fit.py (under horovodrun -np 2): examples/keras_fit.py run
uninterrupted into OUT/reference (each rank writes what it ends with: OUT/rank-R.json, with the weights of a
custom GradientTape loop through DistributedOptimizer, and the rows of each batch it trained on), then
again into OUT/killed, where every rank kills itself (SIGKILL) once the checkpoint of epoch KILL_AFTER is on
disk. With --resume in the arguments (any number of workers): the example resumed from --checkpoints,
each rank writing the rows of each batch it trained on to OUT/resumed-SIZE-rank-R.json."""

import hashlib
import importlib.util
import json
import os
import signal
import sys
import types
from pathlib import Path

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import hvdtrain.keras as hk

REPO = Path(__file__).resolve().parents[3]
KILL_AFTER = 1


def example():
    spec = importlib.util.spec_from_file_location("keras_fit_example", REPO / "examples" / "keras_fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digest(variables):
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(np.asarray(v.numpy())).tobytes())
    return h.hexdigest()


class Kill(keras.callbacks.Callback):
    """After epoch KILL_AFTER's checkpoint (rank 0 wrote it before the barrier): every rank SIGKILLs itself."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == KILL_AFTER:
            hvd.broadcast_object(None, name="kill-barrier")
            os.kill(os.getpid(), signal.SIGKILL)


class Final(keras.callbacks.Callback):
    def on_train_end(self, logs=None):
        self.model_digest = digest(self.model.variables)
        self.optimizer_digest = digest(self.model.optimizer.variables)
        self.iterations = int(self.model.optimizer.iterations.numpy())


def record_batches(fit, args):
    """Make the example's ``hk.batches`` also note, for each epoch it will train, the row numbers (in
    the arrays the example loaded) of each batch this worker gets: ``{epoch: [[rows], ...]}``."""
    epochs, seen = int(args[args.index("--epochs") + 1]), {}
    real = hk.batches

    def batches(x, y=None, *more, **kwargs):
        data, steps = real(x, y, *more, **kwargs)
        start = kwargs.get("initial_epoch", 0)
        number = {row.tobytes(): i for i, row in enumerate(np.asarray(x))}
        taken = [[number[row.tobytes()] for row in batch[0].numpy()]
                 for batch in data.take((epochs - start) * steps)]
        seen.update({e: taken[(e - start) * steps:(e - start + 1) * steps] for e in range(start, epochs)})
        return data, steps

    fit.hk = types.SimpleNamespace(**{**{name: getattr(hk, name) for name in hk.__all__}, "batches": batches})
    return seen


def sharded_refusal():
    """The line batches(global_batch_size=...) refuses sharded arrays with (every worker must give all rows)."""
    try:
        hk.batches(hk.shard(np.arange(10, dtype=np.float32).reshape(10, 1)), global_batch_size=4)
    except ValueError as exc:
        return str(exc)
    return None


def tape_loop():
    """A custom tf.GradientTape loop through DistributedOptimizer.apply, eager then traced, on data
    that differs per rank: the weights agree only if the gradients were averaged."""
    keras.utils.set_random_seed(3 + hvd.rank())  # different initial weights: the broadcast must fix them
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    hk.broadcast_variables(model, 0, optimizer)
    x, y = np.full((8, 4), hvd.rank() + 1.0, np.float32), np.zeros((8, 3), np.float32)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    step()
    traced = tf.function(step)
    traced()
    traced()
    return digest(model.variables)


def powersgd_exchange():
    """model.fit through DistributedOptimizer(comm__compression="powersgd") on data that differs per rank,
    beside a hand-written tf.GradientTape loop calling hvdtrain's PowerSGD exchange itself (the same
    initial weights and batches; plain allreduce ends about 0.05 away from it)."""
    from hvdtrain.core.compression import comm_plan
    from hvdtrain.core.config import load_config
    from hvdtrain.tensorflow.compression import PowerSGD
    from hvdtrain.tensorflow.keras_exchange import exchange_of

    keys = dict(comm__compression="powersgd", comm__powersgd_rank=1, comm__powersgd_min_size=0)
    x = np.random.default_rng(10 + hvd.rank()).normal(size=(32, 6)).astype(np.float32)
    y = np.stack([x[:, 0] - x[:, 1], x[:, 2]], 1)

    def model():
        keras.utils.set_random_seed(3 + hvd.rank())  # different initial weights: the broadcast must fix them
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(2)])

    compressed = model()
    optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(0.05), **keys)
    compressed.compile(optimizer=optimizer, loss="mse")
    losses = compressed.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                            callbacks=[hk.BroadcastGlobalVariablesCallback(0)]).history["loss"]
    by_hand, sgd = model(), keras.optimizers.SGD(0.05)
    hk.broadcast_variables(by_hand, 0, sgd)
    exchange = PowerSGD(comm_plan(load_config(None, framework="tensorflow", **keys)),
                        [tuple(v.shape) for v in by_hand.trainable_variables])

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(by_hand(xb) - yb))
        sgd.apply(exchange.reduce(tape.gradient(loss, by_hand.trainable_variables)), by_hand.trainable_variables)

    for _ in range(3):
        for b in range(2):
            step(x[16 * b:16 * (b + 1)], y[16 * b:16 * (b + 1)])

    gap = max(float(np.max(np.abs(a.numpy() - b.numpy())))
              for a, b in zip(compressed.trainable_variables, by_hand.trainable_variables))
    return {"weights": digest(compressed.variables), "exchange": type(exchange_of(optimizer)).__name__,
            "steps": int(exchange_of(optimizer).steps.numpy()), "losses": losses, "by_hand": gap}


def local_sgd_resume(out):
    """model.fit through DistributedOptimizer(comm__local_sgd_steps=3) on data that differs per rank, 2
    epochs of 4 updates with hk.Checkpoints, then again from a copy of epoch 1's checkpoint (taken 1
    update after an averaging, so the workers' models differ) with the initial broadcast callback too:
    each rank's final weights, uninterrupted and resumed."""
    import shutil

    x = np.random.default_rng(20 + hvd.rank()).normal(size=(32, 6)).astype(np.float32)
    y = x[:, :2] * 2

    def fit(folder, resume):
        keras.utils.set_random_seed(3)
        net = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(2)])
        net.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(0.01), comm__local_sgd_steps=3),
                    loss="mse")
        checkpoints = hk.Checkpoints(folder)
        start = checkpoints.restore(net, resume=resume)
        net.fit(x, y, batch_size=8, epochs=2, initial_epoch=start, shuffle=False, verbose=0,
                callbacks=[hk.BroadcastGlobalVariablesCallback(0), checkpoints])
        return digest(net.variables)

    whole = fit(out / "local-sgd", False)
    if hvd.rank() == 0:
        shutil.copytree(out / "local-sgd" / "epoch-0001", out / "local-sgd-resumed" / "epoch-0001")
    hvd.broadcast_object(None, name="local-sgd-copied")
    return {"whole": whole, "resumed": fit(out / "local-sgd-resumed", True)}


def uneven_epoch():
    """issue 61, item 5: 4,097 samples of a tf.data pipeline on 2 workers, hk.shard then batch, one
    epoch of model.fit without steps_per_epoch: rank 0's share was one sample longer, hence a 33rd
    batch whose allreduce waited forever (the job hung); now both take 32 steps. And the review's
    hk.shard(ds.shuffle().batch()) (overlapping shares): the one-line refusal."""
    x = np.random.default_rng(hvd.rank()).normal(size=(4097, 4)).astype(np.float32)
    keras.utils.set_random_seed(5)
    net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    net.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    data = hk.shard(tf.data.Dataset.from_tensor_slices((x, x[:, :1]))).batch(64)
    net.fit(data, epochs=1, verbose=0, callbacks=[hk.BroadcastGlobalVariablesCallback(0)])
    try:
        hk.shard(tf.data.Dataset.from_tensor_slices(x).shuffle(4097).batch(64))
        refused = None
    except ValueError as exc:
        refused = str(exc)
    return {"steps": int(net.optimizer.iterations.numpy()), "weights": digest(net.variables), "refused": refused}


def malformed_restore(out):
    """issue 63, item 13: a copy of the reference run's last checkpoint whose optimizer.npz is cut in
    half, its checksum in the manifest updated (damage the checksums cannot see). Every rank calls
    Checkpoints.restore: each must raise the same CheckpointError (rank 0's failure was raised on rank
    0 alone, before the broadcast rank 1 waits in: the next collective then hung the job)."""
    import shutil

    from hvdtrain.core.checkpoint import CheckpointError

    folder = out / "malformed" / "epoch-0003"
    if hvd.rank() == 0:
        shutil.copytree(out / "reference" / "epoch-0003", folder)
        whole = (folder / "optimizer.npz").read_bytes()
        (folder / "optimizer.npz").write_bytes(whole[:len(whole) // 2])
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["files"]["optimizer.npz"] = hashlib.sha256(whole[:len(whole) // 2]).hexdigest()
        (folder / "manifest.json").write_text(json.dumps(manifest))
    hvd.broadcast_object(None, name="malformed-written")
    net = example().build_model(0)
    net.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.AdamW()), loss="mse")
    try:
        hk.Checkpoints(out / "malformed").restore(net, resume=True)
        problem = None
    except CheckpointError as exc:
        problem = str(exc)
    hvd.broadcast_object(None, name="malformed-restored")  # the next collective: every rank must reach it
    return problem


def main(out, *args):
    out = Path(out)
    fit = example()
    batches = record_batches(fit, args)
    if "--resume" in args:
        fit.main(list(args))
        (out / f"resumed-{hvd.size()}-rank-{hvd.rank()}.json").write_text(json.dumps({"batches": batches}))
        return
    final = Final()
    history = fit.main([*args, "--checkpoints", str(out / "reference")], callbacks=(final,))
    (out / f"rank-{hvd.rank()}.json").write_text(json.dumps({
        "history": history.history, "model": final.model_digest, "optimizer": final.optimizer_digest,
        "iterations": final.iterations, "tape": tape_loop(), "batches": batches,
        "sharded": sharded_refusal()}))
    (out / f"powersgd-rank-{hvd.rank()}.json").write_text(json.dumps(
        {**powersgd_exchange(), "local_sgd": local_sgd_resume(out)}))
    (out / f"uneven-rank-{hvd.rank()}.json").write_text(json.dumps(
        {"uneven": uneven_epoch(), "malformed": malformed_restore(out)}))
    fit.main([*args, "--checkpoints", str(out / "killed")], callbacks=(Kill(),))
    raise SystemExit("not killed")


if __name__ == "__main__":
    main(*sys.argv[1:])
