"""Worker for tests/distributed/test_pipeline.py (TensorFlow, dropout): run under horovodrun -np 4
with ``parallel.pipeline_stages=2`` (2 stages x 2 replicas).

Rank 0 writes, for every rank, its stage's training-mode output on a fixed input (the replicas of a
stage hold equal weights, so the outputs differ only if they draw different dropout masks, as
data-parallel ranks do) and whether its layers' seed states come
back unchanged after a checkpoint written by rank 0 is loaded and broadcast (exact resume).

Usage: ``pipeline_dropout_tensorflow.py REPORT_PATH CHECKPOINT_DIR``.
"""

import json
import sys
from pathlib import Path

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain import ArrayDataset, TrainTask, load_adapter, load_config
from hvdtrain.tensorflow.stage import functional_blocks

FEATURES, WIDTH, CLASSES = 6, 64, 3
report_path, ckpt_dir = sys.argv[1], Path(sys.argv[2])
OVERRIDES = ["train.seed=0", "train.threads=1", "parallel.pipeline_stages=2", "parallel.micro_batches=1",
             "train.batch_size=4", "parallel.cut=[2]"]  # Dense, Dropout | Dense, Dropout, Dense


def make_adapter(config):
    adapter = load_adapter("tensorflow", config.parallel.pipeline_stages)
    adapter.init(config)
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(WIDTH), keras.layers.Dropout(0.5),
                              keras.layers.Dense(WIDTH), keras.layers.Dropout(0.5), keras.layers.Dense(CLASSES)],
                             name="mlp")
    dummy = ArrayDataset(np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64))
    loss = lambda logits, labels: tf.reduce_mean(  # noqa: E731
        keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    task = TrainTask(model, keras.optimizers.SGD(learning_rate=0.1), loss, dummy, dummy, metric_sums=lambda out, y: {},
                     pipeline_blocks=lambda: functional_blocks(model, model.layers[:2]))
    adapter.prepare(task, config)
    return adapter


def seed_states(adapter):
    return [np.asarray(v.numpy()).tolist() for v in adapter.pipeline.stage.seed_states()]


config = load_config(overrides=OVERRIDES)
adapter = make_adapter(config)
adapter.broadcast_state()
ctx = adapter.context()
stage, place = adapter.pipeline.stage, adapter.pipeline.placement
width = FEATURES if place.stage == 0 else WIDTH
# the stage's output on a fixed input in training mode: equal weights on both replicas, so it differs by the masks
outputs = [stage.run_blocks(tf.ones([4, width]), None, True).numpy().tolist() for _ in range(2)]
before_save = seed_states(adapter)  # the counters moved with the two draws above

adapter.gather_state()
if ctx.rank == 0:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    adapter.save_state(ckpt_dir)
hvd.allreduce(tf.zeros(1), name="saved")
second = make_adapter(config)
if ctx.rank == 0:
    second.load_state(ckpt_dir)
second.broadcast_state()
rows = hvd.allgather_object({"rank": ctx.rank, "stage": place.stage, "replica": place.replica, "outputs": outputs,
                             "seed_states": before_save, "reloaded_seed_states": seed_states(second)})
if ctx.rank == 0:
    Path(report_path).write_text(json.dumps(rows))
