"""Worker for tests/distributed/test_flat_gradients.py: run under horovodrun -np 2.

ZeRO-2 (``parallel.shard_optimizer=gradients``, AdamW, clipping) runs twice the same way: its
slices averaged by one in-place allreduce (the CPU default) and by Horovod's reduce-scatter in
pieces of 8 elements (the GPU path); the record's sides are then ``allreduce`` and ``reducescatter``.

``python flat_gradients.py REPORT``: for each case, two fresh adapters train the same model from
the same weights on the same rank-specific batches: one with ``comm.flat_gradients=true`` (the
default: gradients in flat buffers, one in-place allreduce per update) and one with ``false``
(Horovod's DistributedOptimizer). Rank 0 writes, per case and side, the exchange's class, the
final parameters and optimizer state (as float64 lists), the skipped updates, whether every
``p.grad`` was still a view of the flat buffer after the last update, and the parameter spread
across ranks.
"""

import json
import sys

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

from hvdtrain import ArrayDataset, TrainTask, load_config
from hvdtrain.torch import TorchAdapter

REPORT = sys.argv[1]
FEATURES, CLASSES, PER_RANK, UPDATES = 6, 3, 4, 4
CASES = {
    "sgd": ["optim.name=sgd", "optim.momentum=0.9", "optim.weight_decay=0.01"],
    "adamw_accumulation_clip": ["optim.name=adamw", "optim.weight_decay=0.01", "train.grad_accumulation=2",
                                "optim.grad_clip_norm=0.05"],
    "fp16_wire": ["optim.name=sgd", "comm.compression=fp16"],
    "nonfinite_skip": ["optim.name=adam", "train.nonfinite=skip"],
}
ZERO2 = ["optim.name=adamw", "optim.weight_decay=0.01", "optim.grad_clip_norm=0.05",
         "parallel.shard_optimizer=gradients"]


def make_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, CLASSES))


def run(case, overrides, flat):
    """Train one side; returns its record (rank 0's view) and the parameter spread."""
    from hvdtrain.torch import build_optimizer, decay_groups
    from hvdtrain.torch import sharded

    sharded.SCATTER_ELEMENTS = 8  # several reduce-scatter pieces, as a large model's
    sharded.FlatReduceScatter.by_allreduce = flat

    adapter = TorchAdapter()
    ctx = adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))
    config = load_config(overrides=["train.seed=0", "train.threads=1", f"comm.flat_gradients={str(flat).lower()}",
                                    *overrides])
    model = make_model()
    dummy = ArrayDataset(np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64))
    optimizer = build_optimizer(decay_groups(model, config.optim.weight_decay), config.optim)
    adapter.prepare(TrainTask(model, optimizer, F.cross_entropy, dummy, dummy, lambda out, y: {}), config)
    adapter.broadcast_state()
    rng = np.random.default_rng(11 + ctx.rank)
    accumulation = config.train.grad_accumulation
    for update in range(UPDATES):
        adapter.set_learning_rate(0.1 / (update + 1))
        for micro in range(accumulation):
            x = rng.standard_normal((PER_RANK, FEATURES)).astype(np.float32)
            y = rng.integers(0, CLASSES, PER_RANK).astype(np.int64)
            if case == "nonfinite_skip" and update == 1 and ctx.rank == 0:
                x[0, 0] = np.inf  # one rank's non-finite gradient: every rank skips this update
            adapter.train_step(x, y, apply_update=micro == accumulation - 1)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    if case == "zero2":
        adapter.gather_state()
    saved = adapter.optimizer.state_dict() if case != "zero2" or ctx.rank == 0 else {"state": {}}
    state = [t.detach().double().reshape(-1) for s in saved["state"].values() for t in s.values() if torch.is_tensor(t)]
    buffers = getattr(adapter.exchange, "buffers", None)
    views = None
    if buffers is not None:
        spans = [(f.data_ptr(), f.data_ptr() + f.numel() * f.element_size()) for f in buffers.flats]
        views = all(p.grad is not None and any(a <= p.grad.data_ptr() < b for a, b in spans)
                    for p in model.parameters())
    gathered = hvd.allgather_object(params.numpy())
    spread = float(max(np.abs(g - gathered[0]).max() for g in gathered))
    return {"exchange": type(adapter.exchange).__name__, "params": params.tolist(),
            "state": torch.cat(state).tolist() if state else [], "skipped": adapter.skipped_updates,
            "grads_are_views": views, "spread": spread, "world_size": ctx.size}


report = {case: {side: run(case, overrides, side == "flat") for side in ("flat", "horovod")}
          for case, overrides in CASES.items()}
report["zero2"] = {side: run("zero2", ZERO2, side == "allreduce") for side in ("allreduce", "reducescatter")}
if hvd.rank() == 0:
    with open(REPORT, "w") as f:
        json.dump(report, f)
