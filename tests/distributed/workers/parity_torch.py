"""Worker for tests/distributed/test_parity.py (PyTorch): run under horovodrun -np 2.

Writes a JSON report (rank 0) with: parameter spread across ranks before/after the broadcast,
the allreduced gradient's error against a one-process gradient on the concatenated batch, and
the parameter spread after several training steps on rank-specific data.
"""

import json
import sys

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

from hvdtrain import ArrayDataset, OptimConfig, TrainConfig, TrainTask
from hvdtrain.torch import TorchAdapter

out_path, accumulation, fp16 = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "fp16"
LR, BATCH, FEATURES, CLASSES = 0.5, 4, 8, 3


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().numpy()


def spread(vectors):
    return float(max(np.abs(v - vectors[0]).max() for v in vectors))


adapter = TorchAdapter()
ctx = adapter.init(TrainConfig(seed=0, threads=1))
torch.manual_seed(100 + ctx.rank)  # a different init on every rank: the broadcast must fix it
model = make_model()
dummy = ArrayDataset(np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64))
task = TrainTask(model, torch.optim.SGD(model.parameters(), lr=LR), F.cross_entropy, dummy, dummy,
                 metric_sums=lambda out, y: {"correct": (out.argmax(1) == y).sum()})
adapter.prepare(task, TrainConfig(grad_accumulation=accumulation, fp16_allreduce=fp16), OptimConfig(momentum=0.0))

before = spread(hvd.allgather_object(flat(model)))
adapter.broadcast_state()
after = spread(hvd.allgather_object(flat(model)))
initial = {k: v.clone() for k, v in model.state_dict().items()}

rng = np.random.default_rng(1234)
n_all = ctx.size * accumulation * BATCH
x_all = rng.standard_normal((n_all, FEATURES)).astype(np.float32)
y_all = rng.integers(0, CLASSES, n_all).astype(np.int64)
mine = np.arange(n_all).reshape(ctx.size, accumulation, BATCH)[ctx.rank]
adapter.set_learning_rate(LR)
for i, idx in enumerate(mine):
    adapter.train_step(x_all[idx], y_all[idx], apply_update=i == accumulation - 1)
update = (np.concatenate([v.double().reshape(-1).numpy() for v in initial.values()]) - flat(model)) / LR

reference = make_model()
reference.load_state_dict(initial)
F.cross_entropy(reference(torch.from_numpy(x_all)), torch.from_numpy(y_all)).backward()
expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).double().numpy()

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
