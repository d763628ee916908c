"""Worker for tests/distributed/test_parity.py (TensorFlow/Keras 3): run under horovodrun -np 2.

Same report as parity_torch.py.
"""

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from parity_common import (CLASSES, FEATURES, LR, case_overrides, global_batch, micro_batches, parse_args, report,
                           run_cases, spread, train_on_rank_specific_data)

from hvdtrain import ArrayDataset, TrainTask, load_config
from hvdtrain.tensorflow import TensorFlowAdapter

out_path, cases = parse_args()


def make_model():
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(CLASSES)])


def loss_fn(logits, labels):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def flat(model):
    return np.concatenate([np.asarray(v).reshape(-1) for v in model.get_weights()]).astype(np.float64)


def run_case(accumulation, fp16):
    """One case with a fresh adapter and model: its report, and the rank."""
    adapter = TensorFlowAdapter()
    ctx = adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))
    keras.utils.set_random_seed(100 + ctx.rank)  # a different init on every rank: the broadcast must fix it
    model = make_model()
    dummy = ArrayDataset(np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64))
    task = TrainTask(model, keras.optimizers.SGD(learning_rate=LR), loss_fn, dummy, dummy,
                     metric_sums=lambda out, y: {"correct": tf.reduce_sum(tf.cast(tf.argmax(out, 1) == y, tf.float32))})
    adapter.prepare(task, load_config(overrides=case_overrides(accumulation, fp16)))

    before = spread(hvd.allgather_object(flat(model)))
    adapter.broadcast_state()
    after = spread(hvd.allgather_object(flat(model)))
    initial = model.get_weights()

    x_all, y_all, rng = global_batch(ctx.size, accumulation)
    adapter.set_learning_rate(LR)
    for i, idx in enumerate(micro_batches(ctx.rank, ctx.size, accumulation)):
        adapter.train_step(x_all[idx], y_all[idx], apply_update=i == accumulation - 1)
    update = (np.concatenate([w.reshape(-1) for w in initial]).astype(np.float64) - flat(model)) / LR

    reference = make_model()
    reference.set_weights(initial)
    with tf.GradientTape() as tape:
        loss = loss_fn(reference(x_all), y_all)
    expected = np.concatenate([g.numpy().reshape(-1) for g in tape.gradient(loss, reference.trainable_variables)])

    train_on_rank_specific_data(adapter, rng, ctx.rank)
    return ctx.rank, report(ctx, before, after, update, expected, spread(hvd.allgather_object(flat(model))))


run_cases(out_path, cases, run_case)
