"""Worker for tests/distributed/test_sharded_optimizer_tf.py: run under horovodrun -np N.

``python sharded_updates_tf.py REPORT [EARLIER_REPORT]``: for SGD (momentum, coupled weight
decay), Adam and AdamW (decoupled decay; also with two micro-batches per update and float16 on the
wire), a two-layer Keras model whose buffers (kernels with decay, biases without; in buckets of 16
elements, a kernel cut at its rows) do not divide by the world size is trained through the TensorFlow adapter for three updates (a different LR each,
global-norm clipping on, each rank its own slice of the global batch), with
``parallel.shard_optimizer`` none, optimizer and gradients, from the same weights. Each run's
checkpoint (``gather_state`` on every rank, ``save_state`` on rank 0: real files beside REPORT) is
then resumed by another kind of run (``load_state`` on rank 0, ``broadcast_state``), which takes
one more update. With EARLIER_REPORT (a run on another number of ranks) AdamW only, and the runs
resumed are that run's checkpoints instead, written on that many ranks. Rank 0 writes the weights
after every update, where the checkpoints are, their ``optimizer.npz`` variable paths without
Keras's numbering and the bytes of optimizer state each rank keeps.
"""

import json
import sys
from pathlib import Path

import numpy as np

from hvdtrain import ArrayDataset, TrainTask, load_config

REPORT = Path(sys.argv[1])
EARLIER = json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else None
FEATURES, HIDDEN, CLASSES, PER_RANK = 7, 5, 3, 4
# buckets of at most 16 elements: the 7x5 kernel is cut at its rows into three buckets, the last
# shared with the 5x3 kernel's first rows (kernels 15, 15, 14, 6; biases 8), so each update runs
# five reduce-scatters (or allreduces) and five all-gathers
BUCKET_ELEMENTS = 16
LRS = [0.1, 0.3, 0.05, 0.2]
MODES = ("none", "optimizer", "gradients", "gradients/reducescatter")
OPTIMIZERS = {"sgd": ["optim.name=sgd", "optim.momentum=0.9", "optim.weight_decay=0.01"],
              "adam": ["optim.name=adam", "optim.weight_decay=0.01"],
              "adamw": ["optim.name=adamw", "optim.weight_decay=0.01"],
              # two micro-batches per update, float16 on the wire
              "adamw_accumulation_fp16": ["optim.name=adamw", "optim.weight_decay=0.01", "train.grad_accumulation=2",
                                          "comm.compression=fp16"]}
# a sharded run's checkpoint resumed by data parallelism and the other way round (the other pairs
# on 4 ranks, from EARLIER's checkpoints)
RESUMES = (("optimizer", "none"), ("none", "gradients"))
RESUMES_ELSEWHERE = (("none", "none"), ("gradients", "optimizer"), ("optimizer", "gradients"))

rng = np.random.default_rng(11)
X = rng.standard_normal((256, FEATURES)).astype(np.float32)
Y = rng.integers(0, CLASSES, 256).astype(np.int64)


def main():
    import keras
    import tensorflow as tf

    from hvdtrain.tensorflow import TensorFlowAdapter, build_optimizer, low_rank_variables, sharded
    from hvdtrain.tensorflow.checkpoint import OPTIMIZER_FILE, canonical_paths

    sharded.BUCKET_ELEMENTS = BUCKET_ELEMENTS

    adapter = TensorFlowAdapter()
    ctx = adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))
    start = [np.random.default_rng(3).standard_normal(s).astype(np.float32) * 0.5
             for s in ((FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES), (CLASSES,))]

    def loss(logits, labels):
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))

    def weights(m):
        return [np.asarray(v).tolist() for v in m.trainable_variables]

    def prepared(overrides, mode):
        mode, _, collective = mode.partition("/")  # gradients/reducescatter: ZeRO-2 by reduce-scatter on a CPU too
        config = load_config(overrides=[*overrides, f"parallel.shard_optimizer={mode}", "optim.grad_clip_norm=0.5"])
        m = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                              keras.layers.Dense(CLASSES)])
        for v, value in zip(m.trainable_variables, start):
            v.assign(value)
        dummy = ArrayDataset(X[:2], Y[:2])
        task = TrainTask(m, build_optimizer(config.optim, exclude_variables=low_rank_variables(m)), loss,
                         dummy, dummy, metric_sums=lambda out, y: {})
        adapter.prepare(task, config)
        if collective:
            adapter.exchange.by_allreduce = collective == "allreduce"
        return m

    def update(m, step, history):
        idx = np.arange(step * PER_RANK * ctx.size, (step + 1) * PER_RANK * ctx.size).reshape(ctx.size, PER_RANK)
        adapter.set_learning_rate(LRS[step])
        micro = np.array_split(idx[ctx.rank], adapter.accumulation)
        for i, part in enumerate(micro):
            adapter.train_step(X[part], Y[part], apply_update=i == len(micro) - 1)
        history.append(weights(m))

    def state_bytes():
        sharded = getattr(adapter.optimizer_state, "sharded", None)  # hvdtrain.tensorflow.exchanges.ShardedState
        if sharded is not None:
            return sharded.state_bytes()
        return sum(int(np.asarray(v).nbytes) for v in adapter.optimizer.variables if len(v.shape) > 0)

    report = {"world_size": ctx.size, "runs": {}}
    for name, overrides in OPTIMIZERS.items():
        if EARLIER is not None and name != "adamw":
            continue
        runs = {}
        for mode in MODES:
            m, history = prepared(overrides, mode), []
            adapter.broadcast_state()
            for step in range(3):
                update(m, step, history)
            folder = REPORT.parent / f"{name}-{mode.replace('/', '-')}"
            adapter.gather_state()  # every rank: rank 0 gets the whole optimizer state
            paths = None
            if ctx.rank == 0:
                folder.mkdir()
                adapter.save_state(folder)
                with np.load(folder / OPTIMIZER_FILE) as saved:
                    paths = canonical_paths([str(p) for p in saved["paths"]])
            adapter.barrier()
            runs[mode] = {"weights": history, "state_bytes": adapter.allgather_object(state_bytes()),
                          "checkpoint": str(folder), "paths": paths}
        for mode, other in RESUMES if EARLIER is None else RESUMES_ELSEWHERE:
            m, history = prepared(overrides, other), []
            if ctx.rank == 0:
                earlier = runs if EARLIER is None else EARLIER["runs"][name]
                adapter.load_state(Path(earlier[mode]["checkpoint"]))
            adapter.broadcast_state()
            update(m, 3, history)
            runs[mode][f"resumed_by_{other}"] = history[-1]
        report["runs"][name] = runs
    if ctx.rank == 0:
        REPORT.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
