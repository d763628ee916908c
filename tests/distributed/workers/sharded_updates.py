"""Worker for tests/distributed/test_sharded_optimizer.py: run under horovodrun -np N.

``python sharded_updates.py REPORT``: for SGD (momentum, coupled weight decay), Adam and AdamW
(decoupled decay; also with two micro-batches per update and float16 on the wire), a two-layer model
whose parameter groups (weights with decay, biases without) do not divide by the world size is
trained through the torch adapter for three updates (a different LR each, global-norm clipping on,
each rank its own slice of the global batch), with ``parallel.shard_optimizer=none``, ``=optimizer``
(ZeRO-1) and ``=gradients`` (ZeRO-2), from the same weights. Then each sharded run's checkpoint state
(what rank 0 would save) is loaded into a data-parallel run and the other way round, which takes one
more update. Rank 0 writes the weights after every update, the saved optimizer states, the bytes of
optimizer state each rank keeps and (ZeRO-2) the bytes of gradients each rank holds right after the
exchange. Last (ZeRO-2, ``train.nonfinite=skip``): rank 0 alone puts an infinity into a local
gradient that lands in the last rank's shard; every rank must skip that update.
"""

import json
import sys

import numpy as np

from hvdtrain import ArrayDataset, TrainTask, load_config

REPORT = sys.argv[1]
FEATURES, HIDDEN, CLASSES, PER_RANK = 7, 5, 3, 4
LRS = [0.1, 0.3, 0.05, 0.2]
OPTIMIZERS = {"sgd": ["optim.name=sgd", "optim.momentum=0.9", "optim.weight_decay=0.01"],
              "adam": ["optim.name=adam", "optim.weight_decay=0.01"],
              "adamw": ["optim.name=adamw", "optim.weight_decay=0.01"],
              # two micro-batches per update, float16 on the wire
              "adamw_accumulation_fp16": ["optim.name=adamw", "optim.weight_decay=0.01", "train.grad_accumulation=2",
                                          "comm.compression=fp16"]}

rng = np.random.default_rng(11)
X = rng.standard_normal((256, FEATURES)).astype(np.float32)
Y = rng.integers(0, CLASSES, 256).astype(np.int64)


def main():
    import torch
    import torch.nn.functional as F

    from hvdtrain.torch import TorchAdapter, build_optimizer, decay_groups
    from hvdtrain.torch import sharded
    from hvdtrain.torch.sharded import FlatReduceScatter, ShardedOptimizer

    sharded.SCATTER_ELEMENTS = 8  # ZeRO-2 reduce-scatters these small buffers in several pieces, as a large model's
    sharded.CHUNK_ELEMENTS = 4  # and the shard optimizer steps each shard in several chunks, as a large model's

    adapter = TorchAdapter()
    ctx = adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))
    torch.manual_seed(3)
    start = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))

    def weights(m):
        return [p.detach().numpy().tolist() for p in m.parameters()]

    def prepared(overrides, mode):
        config = load_config(overrides=[*overrides, f"parallel.shard_optimizer={mode}", "optim.grad_clip_norm=0.5",
                                        "train.nonfinite=skip"])
        m = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))
        m.load_state_dict(start.state_dict())
        dummy = ArrayDataset(X[:2], Y[:2])
        task = TrainTask(m, build_optimizer(decay_groups(m, config.optim.weight_decay), config.optim),
                         F.cross_entropy, dummy, dummy, metric_sums=lambda out, y: {})
        adapter.prepare(task, config)
        return m

    def update(m, step, history):
        idx = np.arange(step * PER_RANK * ctx.size, (step + 1) * PER_RANK * ctx.size).reshape(ctx.size, PER_RANK)
        adapter.set_learning_rate(LRS[step])
        micro = np.array_split(idx[ctx.rank], adapter.accumulation)
        for i, part in enumerate(micro):
            adapter.train_step(X[part], Y[part], apply_update=i == len(micro) - 1)
        history.append(weights(m))

    def saved_state():
        """What rank 0's checkpoint would hold: the optimizer's whole state (None on other ranks)."""
        adapter.gather_state()
        if ctx.rank != 0:
            return None
        state = adapter.optimizer.state_dict()
        return {str(i): {k: np.asarray(v).tolist() for k, v in s.items()} for i, s in state["state"].items()}, state

    def state_bytes():
        opt = adapter.optimizer
        state = opt.inner.state if isinstance(opt, ShardedOptimizer) else opt.state
        return sum(v.numel() * v.element_size() for s in state.values() for v in s.values()
                   if torch.is_tensor(v) and v.dim() > 0)

    held = []  # ZeRO-2: bytes of gradients this rank holds right after each exchange

    def spied(exchange):
        if isinstance(exchange, FlatReduceScatter):
            reduce = exchange.reduce

            def reduce_and_count(grads):
                out = reduce(grads)
                model_grads = sum(p.grad.numel() * p.grad.element_size() for p in exchange.optimizer.layouts[0].params
                                  + exchange.optimizer.layouts[1].params if p.grad is not None)
                held.append(exchange.optimizer.gradient_bytes() + model_grads)
                return out
            exchange.reduce = reduce_and_count

    report = {"world_size": ctx.size, "runs": {}}
    for name, overrides in OPTIMIZERS.items():
        runs = {}
        for mode in ("none", "optimizer", "gradients"):
            m, history = prepared(overrides, mode), []
            adapter.broadcast_state()
            spied(adapter.exchange)
            held.clear()
            for step in range(3):
                update(m, step, history)
            nbytes = adapter.allgather_object(state_bytes())
            saved = saved_state()
            runs[mode] = {"weights": history, "state_bytes": nbytes, "model": m.state_dict(),
                          "saved": saved[0] if saved else None, "whole": saved[1] if saved else None,
                          "grad_bytes_after_exchange": adapter.allgather_object(list(held))}
        # each run's checkpoint resumed by another kind of run: one more update
        resumes = {}
        for mode, other in (("none", "optimizer"), ("optimizer", "none"), ("none", "gradients"),
                            ("gradients", "none")):
            m, history = prepared(overrides, other), []
            m.load_state_dict(runs[mode]["model"])
            if ctx.rank == 0:
                adapter.optimizer.load_state_dict(runs[mode]["whole"])
            adapter.broadcast_state()
            update(m, 3, history)
            resumes[f"{mode}->{other}"] = history[-1]
        for mode in runs:
            runs[mode].pop("model")
            runs[mode].pop("whole")
        report["runs"][name] = {**runs, "resumes": resumes}

    # ZeRO-2: an infinity in one rank's local gradient, in the last rank's shard, skips the update everywhere
    m = prepared(OPTIMIZERS["adamw"], "gradients")
    adapter.broadcast_state()
    before, skips = weights(m), adapter.skipped_updates
    part = np.arange(ctx.rank * PER_RANK, (ctx.rank + 1) * PER_RANK)
    adapter.set_learning_rate(0.1)
    adapter.train_step(X[part], Y[part], apply_update=False)
    if ctx.rank == 0:
        m[2].bias.grad[-1] = float("inf")  # the last element of the bias group: the last rank's shard
    adapter.train_step(X[part], Y[part], apply_update=True)
    unchanged = weights(m) == before
    update(m, 0, [])  # and the next update is applied normally
    report["nonfinite"] = adapter.allgather_object({"skipped": adapter.skipped_updates - skips,
                                                    "unchanged": unchanged, "moved_after": weights(m) != before})
    if ctx.rank == 0:
        with open(REPORT, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
