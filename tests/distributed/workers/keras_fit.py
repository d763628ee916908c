"""Worker of tests/distributed/test_keras_fit.py (under horovodrun -np 2): examples/keras_fit.py run
uninterrupted into OUT/reference (each rank writes what it ends with: OUT/rank-R.json, with the weights of a
custom GradientTape loop through DistributedOptimizer), then again into
OUT/killed, where every rank kills itself (SIGKILL) once the checkpoint of epoch KILL_AFTER is on disk."""

import hashlib
import importlib.util
import json
import os
import signal
import sys
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


def main(out, *args):
    out = Path(out)
    fit = example()
    final = Final()
    history = fit.main([*args, "--checkpoints", str(out / "reference")], callbacks=(final,))
    (out / f"rank-{hvd.rank()}.json").write_text(json.dumps({
        "history": history.history, "model": final.model_digest, "optimizer": final.optimizer_digest,
        "iterations": final.iterations, "tape": tape_loop()}))
    fit.main([*args, "--checkpoints", str(out / "killed")], callbacks=(Kill(),))
    raise SystemExit("not killed")


if __name__ == "__main__":
    main(*sys.argv[1:])
