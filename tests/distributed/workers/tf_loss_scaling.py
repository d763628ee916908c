"""Worker for tests/distributed/test_mixed_precision.py: ``python tf_loss_scaling.py REPORT DIR``.

One process (Horovod of size 1) drives the TensorFlow adapter with ``train.mixed_precision=fp16``
on the CPU (the CLI refuses fp16 without a GPU, so the policy is set here, after ``init``): a
normal update, then an update whose fp16 gradients overflow, then a checkpoint written, the
scale changed, and the checkpoint read back. Writes what the test asserts on.
"""

import json
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from hvdtrain import ArrayDataset, TrainTask, load_config
from hvdtrain.tensorflow import TensorFlowAdapter, build_optimizer

REPORT, DIRECTORY = sys.argv[1], Path(sys.argv[2])
FEATURES, CLASSES = 8, 3

adapter = TensorFlowAdapter()
adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))
keras.mixed_precision.set_global_policy("mixed_float16")
config = load_config(overrides=["train.mixed_precision=fp16", "optim.name=sgd", "optim.momentum=0.0",
                                "train.nonfinite=error"])
model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                          keras.layers.Dense(CLASSES, dtype="float32")])


def loss(logits, labels):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


rng = np.random.default_rng(0)
x = rng.standard_normal((16, FEATURES)).astype(np.float32)
y = rng.integers(0, CLASSES, 16).astype(np.int64)
dummy = ArrayDataset(x, y)
adapter.prepare(TrainTask(model, build_optimizer(config.optim), loss, dummy, dummy, metric_sums=lambda o, t: {}),
                config)
adapter.broadcast_state()
adapter.set_learning_rate(0.1)
scaler = adapter.optimizer
report = {"optimizer": type(scaler).__name__, "initial_scale": float(scaler.dynamic_scale.numpy())}

before = [np.array(v.numpy()) for v in model.trainable_variables]
with tf.GradientTape() as tape:  # the fp32 gradient of the same loss, for the size of the update
    reference_loss = loss(model(x, training=True), y)
reference = tape.gradient(reference_loss, model.trainable_variables)
adapter.train_step(x, y, apply_update=True)
after = [np.array(v.numpy()) for v in model.trainable_variables]
report["update_error"] = max(float(np.abs((b - a) / 0.1 - np.asarray(g)).max())
                             for b, a, g in zip(before, after, reference))
report["update_size"] = max(float(np.abs(np.asarray(g)).max()) for g in reference)
report["skipped_after_finite"] = adapter.skipped_updates

scaler.dynamic_scale.assign(1e30)  # the scaled gradient overflows float16: skipped (and counted), not an error
adapter.train_step(x, y, apply_update=True)
report["skipped_after_overflow"] = adapter.skipped_updates
report["scale_after_overflow"] = float(scaler.dynamic_scale.numpy())
report["weights_unchanged_by_overflow"] = all(
    np.array_equal(a, np.asarray(v.numpy())) for a, v in zip(after, model.trainable_variables))

DIRECTORY.mkdir(parents=True, exist_ok=True)
adapter.save_state(DIRECTORY)
saved_scale = float(scaler.dynamic_scale.numpy())
scaler.dynamic_scale.assign(1.0)
scaler.step_counter.assign(7)
adapter.load_state(DIRECTORY)
report["saved_scale"] = saved_scale
report["restored_scale"] = float(scaler.dynamic_scale.numpy())
report["restored_counter"] = int(scaler.step_counter.numpy())
with open(REPORT, "w") as f:
    json.dump(report, f)
