"""Baseline: a minimal hand-written Horovod + TensorFlow/Keras 3 training loop.

The loop of Horovod's TF2 examples (``tf.function`` step with ``hvd.DistributedGradientTape``,
variables broadcast from rank 0), with the Keras 3 fix every user needs (Horovod gets the
``tf.Variable`` inside each ``keras.Variable``). Same model (the image recipe's), data, batch and
seed as the hvdtrain side; one intra-op and one inter-op thread per rank.

    horovodrun -np 2 -H localhost:2 python benchmarks/horovod_tf_loop.py --samples 4096
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from typing import Iterator

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import common
from hvdtrain_recipes.image_classification.keras_models import build_model


def _variables(variables):
    return [getattr(v, "value", v) for v in variables]


def train_steps(x: np.ndarray, y: np.ndarray, batch: int = common.BATCH, seed: int = common.SEED,
                model_name: str = common.MODEL) -> Iterator[None]:
    """Train on this rank's shard of ``x``, epoch after epoch, yielding after every step (so the
    benchmark can interleave it with hvdtrain's steps)."""
    hvd.init()  # distributed
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(seed)
    model = build_model(model_name, x.shape[1:], 10)
    optimizer = keras.optimizers.SGD(learning_rate=common.LR * hvd.size(), momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(reduce_retracing=True)
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)  # distributed: allreduce gradients
        grads = tape.gradient(loss, _variables(model.trainable_variables))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    hvd.broadcast_variables(_variables(model.variables) + _variables(optimizer.variables), root_rank=0)  # distributed
    for idx in common.shard_batches(len(x), hvd.rank(), hvd.size(), batch, seed):  # distributed: this rank's samples
        step(tf.constant(x[idx]), tf.constant(y[idx]))
        yield


def train_epoch(x: np.ndarray, y: np.ndarray, batch: int = common.BATCH, seed: int = common.SEED,
                model_name: str = common.MODEL) -> list[float]:
    """One epoch over this rank's shard of ``x``; returns the time each step ended."""
    steps = train_steps(x, y, batch, seed, model_name)
    next(steps)  # the first step also initialises Horovod, builds the model and traces the step
    ends = [time.perf_counter()]
    for _ in itertools.islice(steps, math.ceil(len(x) // hvd.size() / batch) - 1):
        ends.append(time.perf_counter())
    return ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=common.BATCH)
    args = parser.parse_args()
    x, y, _, _ = common.mnist_arrays(args.samples, channels_first=False)
    rate = common.steady_rate(train_epoch(x, y, args.batch_size), args.batch_size)
    if hvd.rank() == 0:
        print(f"horovod tensorflow loop: {rate:.1f} samples/s per worker on {hvd.size()} worker(s)")


if __name__ == "__main__":
    main()
