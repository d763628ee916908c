"""Worker for tests/distributed/test_parity.py (TensorFlow/Keras 3): run under horovodrun -np 2.

Same report as parity_torch.py.
"""

import json
import sys

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain import ArrayDataset, OptimConfig, TrainConfig, TrainTask
from hvdtrain.tensorflow import TensorFlowAdapter

out_path, accumulation, fp16 = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "fp16"
LR, BATCH, FEATURES, CLASSES = 0.5, 4, 8, 3


def make_model():
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(CLASSES)])


def loss_fn(logits, labels):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def flat(model):
    return np.concatenate([np.asarray(v).reshape(-1) for v in model.get_weights()]).astype(np.float64)


def spread(vectors):
    return float(max(np.abs(v - vectors[0]).max() for v in vectors))


adapter = TensorFlowAdapter()
ctx = adapter.init(TrainConfig(seed=0, threads=1))
keras.utils.set_random_seed(100 + ctx.rank)  # a different init on every rank: the broadcast must fix it
model = make_model()
dummy = ArrayDataset(np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64))
task = TrainTask(model, keras.optimizers.SGD(learning_rate=LR), loss_fn, dummy, dummy,
                 metric_sums=lambda out, y: {"correct": tf.reduce_sum(tf.cast(tf.argmax(out, 1) == y, tf.float32))})
adapter.prepare(task, TrainConfig(grad_accumulation=accumulation, fp16_allreduce=fp16), OptimConfig(momentum=0.0))

before = spread(hvd.allgather_object(flat(model)))
adapter.broadcast_state()
after = spread(hvd.allgather_object(flat(model)))
initial = model.get_weights()

rng = np.random.default_rng(1234)
n_all = ctx.size * accumulation * BATCH
x_all = rng.standard_normal((n_all, FEATURES)).astype(np.float32)
y_all = rng.integers(0, CLASSES, n_all).astype(np.int64)
mine = np.arange(n_all).reshape(ctx.size, accumulation, BATCH)[ctx.rank]
adapter.set_learning_rate(LR)
for i, idx in enumerate(mine):
    adapter.train_step(x_all[idx], y_all[idx], apply_update=i == accumulation - 1)
update = (np.concatenate([w.reshape(-1) for w in initial]).astype(np.float64) - flat(model)) / LR

reference = make_model()
reference.set_weights(initial)
with tf.GradientTape() as tape:
    loss = loss_fn(reference(x_all), y_all)
expected = np.concatenate([g.numpy().reshape(-1) for g in tape.gradient(loss, reference.trainable_variables)])

for step in range(5):
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32) + ctx.rank
    y = rng.integers(0, CLASSES, BATCH).astype(np.int64)
    adapter.train_step(x, y, apply_update=True)
final = spread(hvd.allgather_object(flat(model)))

if ctx.rank == 0:
    with open(out_path, "w") as f:
        json.dump({"world_size": ctx.size, "spread_before_broadcast": before, "spread_after_broadcast": after,
                   "grad_max_abs_error": float(np.abs(update - expected).max()),
                   "grad_max_abs": float(np.abs(expected).max()), "spread_after_steps": final}, f)
