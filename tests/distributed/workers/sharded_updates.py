"""Worker for tests/distributed/test_sharded_optimizer.py: run under horovodrun -np N.

``python sharded_updates.py REPORT``: for SGD (momentum, coupled weight decay), Adam and AdamW
(decoupled decay; also with two micro-batches per update and float16 on the wire), a two-layer model whose parameter groups (weights with decay, biases without)
do not divide by the world size is trained through the torch adapter for three updates (a
different LR each, global-norm clipping on, each rank its own slice of the global batch), once with
``parallel.shard_optimizer=none`` and once with ``=optimizer``, from the same weights. Then each
run's checkpoint state (what rank 0 would save) is loaded into the other kind of run, which takes
one more update. Rank 0 writes the weights after every update, the saved optimizer states, and the
bytes of optimizer state each rank keeps.
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
    from hvdtrain.torch.sharded import ShardedOptimizer

    adapter = TorchAdapter()
    ctx = adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))
    torch.manual_seed(3)
    start = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))

    def weights(m):
        return [p.detach().numpy().tolist() for p in m.parameters()]

    def prepared(overrides, mode):
        config = load_config(overrides=[*overrides, f"parallel.shard_optimizer={mode}", "optim.grad_clip_norm=0.5"])
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

    report = {"world_size": ctx.size, "runs": {}}
    for name, overrides in OPTIMIZERS.items():
        runs = {}
        for mode in ("none", "optimizer"):
            m, history = prepared(overrides, mode), []
            adapter.broadcast_state()
            for step in range(3):
                update(m, step, history)
            nbytes = adapter.allgather_object(state_bytes())
            saved = saved_state()
            runs[mode] = {"weights": history, "state_bytes": nbytes, "model": m.state_dict(),
                          "saved": saved[0] if saved else None, "whole": saved[1] if saved else None}
        # each run's checkpoint resumed by the other kind of run: one more update
        for mode, other in (("none", "optimizer"), ("optimizer", "none")):
            m, history = prepared(overrides, other), []
            m.load_state_dict(runs[mode]["model"])
            if ctx.rank == 0:
                adapter.optimizer.load_state_dict(runs[mode]["whole"])
            adapter.broadcast_state()
            update(m, 3, history)
            runs[mode]["resumed_by_other"] = history[-1]
        for mode in runs:
            runs[mode].pop("model")
            runs[mode].pop("whole")
        report["runs"][name] = runs
    if ctx.rank == 0:
        with open(REPORT, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
