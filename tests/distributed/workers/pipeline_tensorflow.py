"""Worker for tests/distributed/test_pipeline.py (TensorFlow): run under horovodrun -np 4 with
``parallel.pipeline_stages=2`` (2 stages x 2 replicas); the same report as pipeline_torch.py.

Usage: ``pipeline_tensorflow.py REPORT_PATH MICRO_BATCHES CLIP_NORMS CHECKPOINT_DIR`` (one case per
comma-separated clip norm, the report one entry per norm).
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

LR, BATCH, FEATURES, CLASSES = 0.5, 8, 6, 3
report_path, micro, clips, ckpt_root = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), Path(sys.argv[4])


def make_model():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(CLASSES)], name="mlp")


def loss_fn(logits, labels):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def metric_sums(out, y):
    return {"correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(out, 1), y), tf.float32))}


def make_adapter(config, perturbed_rank):
    adapter = load_adapter("tensorflow", config.parallel.pipeline_stages)
    ctx = adapter.init(config)
    model = make_model()
    if ctx.rank == perturbed_rank:  # a different init on one rank: the broadcast (or the load) must fix it
        model.layers[2].kernel.assign(tf.zeros_like(model.layers[2].kernel))
    dummy = ArrayDataset(np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64))
    task = TrainTask(model, keras.optimizers.SGD(learning_rate=LR), loss_fn, dummy, dummy, metric_sums=metric_sums,
                     pipeline_blocks=lambda: functional_blocks(model, model.layers[:3]))
    adapter.prepare(task, config)
    return adapter, ctx, model


def named(model, adapter):
    """This stage's trainable values keyed by their index in the whole model (layer names differ between
    model instances)."""
    own = {id(v) for v in adapter.pipeline.stage.trainable}
    return {i: np.asarray(v.numpy(), np.float64) for i, v in enumerate(model.trainable_variables) if id(v) in own}


def case(clip, ckpt_dir):
    """One clip norm's report (on rank 0; None elsewhere)."""
    config = load_config(overrides=["train.seed=0", "train.threads=1", "parallel.pipeline_stages=2",
                                    f"parallel.micro_batches={micro}", "optim.momentum=0.0",
                                    f"optim.grad_clip_norm={clip}", f"train.batch_size={BATCH}"])
    adapter, ctx, model = make_adapter(config, perturbed_rank=3)  # stage 1 of replica 1
    adapter.broadcast_state()
    initial = named(model, adapter)

    rng = np.random.default_rng(1234)
    replicas = ctx.replicas
    x_all = rng.standard_normal((replicas * BATCH, FEATURES)).astype(np.float32)
    y_all = rng.integers(0, CLASSES, replicas * BATCH).astype(np.int64)
    mine = slice(ctx.replica * BATCH, (ctx.replica + 1) * BATCH)
    eval_sums = adapter.allreduce_sums(adapter.eval_step(x_all[mine], y_all[mine]))  # before the update
    adapter.set_learning_rate(LR)
    loss = adapter.train_step(x_all[mine], y_all[mine])
    update = {k: (initial[k] - v) / LR for k, v in named(model, adapter).items()}
    losses = hvd.allgather_object((ctx.replica, loss))
    updates = hvd.allgather_object(update)

    for step in range(4):
        x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32) + ctx.replica
        y = rng.integers(0, CLASSES, BATCH).astype(np.int64)
        adapter.train_step(x, y)
    own = named(model, adapter)
    flats = hvd.allgather_object((ctx.rank, adapter.pipeline.placement.stage,
                                  np.concatenate([v.reshape(-1) for v in own.values()])))

    adapter.gather_state()
    if ctx.rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        assert adapter.pipeline.state_is_finite()
        adapter.save_state(ckpt_dir)
    hvd.allreduce(tf.zeros(1), name="saved")
    second, _, model2 = make_adapter(config, perturbed_rank=1)  # stage 1's root: the load must win
    if ctx.rank == 0:
        second.load_state(ckpt_dir)
    second.broadcast_state()
    reloaded = hvd.allgather_object(named(model2, second))
    trained = hvd.allgather_object(own)

    if ctx.rank == 0:
        reference = make_model()
        with tf.GradientTape() as tape:
            logits = reference(x_all)
            ref_loss = loss_fn(logits, y_all)
        grads = tape.gradient(ref_loss, reference.trainable_variables)
        total = float(tf.linalg.global_norm(grads))
        if clip != "none":
            grads, _ = tf.clip_by_global_norm(grads, float(clip))
        expected = {i: np.asarray(g, np.float64) for i, g in enumerate(grads)}
        got = {}
        for u in updates:
            got.update(u)
        errors = [float(np.abs(got[k] - expected[k]).max()) for k in expected]
        by_stage = {}
        for rank, stage, flat in flats:
            by_stage.setdefault(stage, []).append(flat)
        spread = max(float(np.abs(f - fs[0]).max()) for fs in by_stage.values() for f in fs)
        plain = make_model()
        with np.load(ckpt_dir / "model_variables.npz") as saved:
            for i, v in enumerate(plain.variables):
                v.assign(saved[f"v{i:05d}"])
        trained_all, reloaded_all = {}, {}
        for part in trained:
            trained_all.update(part)
        for part in reloaded:
            reloaded_all.update(part)
        plain_values = {i: np.asarray(v.numpy(), np.float64) for i, v in enumerate(plain.trainable_variables)}
        report = {
            "world_size": ctx.size, "replicas": replicas, "stages": adapter.pipeline.placement.layout.stages,
            "bounds": adapter.pipeline.stage.bounds,
            "loss": float(np.mean([l for _, l in losses])), "ref_loss": float(ref_loss),
            "grad_max_abs_error": max(errors), "grad_max_abs": max(float(np.abs(g).max()) for g in expected.values()),
            "grad_norm": total, "updated_names": sorted(got), "ref_names": sorted(expected),
            "eval_loss_sum": eval_sums["loss_sum"], "eval_count": eval_sums["count"], "eval_correct": eval_sums["correct"],
            "ref_eval_correct": float(np.sum(np.argmax(logits.numpy(), 1) == y_all)),
            "spread_after_steps": spread, "stages_seen": sorted(by_stage),
            "checkpoint_vs_trained": max(float(np.abs(plain_values[k] - t).max()) for k, t in trained_all.items()),
            "reloaded_vs_trained": max(float(np.abs(reloaded_all[k] - t).max()) for k, t in trained_all.items()),
            "reloaded_names": sorted(reloaded_all), "optimizer_groups": 1,
        }
        return report
    return None


reports = {clip: case(clip, ckpt_root / clip) for clip in clips}
if hvd.rank() == 0:
    Path(report_path).write_text(json.dumps(reports))
