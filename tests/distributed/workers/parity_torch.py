"""Worker for tests/distributed/test_parity.py (PyTorch): run under horovodrun -np 2.

Runs each case named on the command line with a fresh adapter and writes a JSON report (rank 0),
by case, with: parameter spread across ranks before/after the broadcast,
the allreduced gradient's error against a one-process gradient on the concatenated batch, and
the parameter spread after several training steps on rank-specific data.
"""

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from parity_common import (CLASSES, FEATURES, LR, case_overrides, global_batch, micro_batches, parse_args, report,
                           run_cases, spread, train_on_rank_specific_data)

from hvdtrain import ArrayDataset, TrainTask, load_config
from hvdtrain.torch import TorchAdapter

out_path, cases = parse_args()


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().numpy()


def run_case(accumulation, fp16):
    """One case with a fresh adapter and model: its report, and the rank."""
    adapter = TorchAdapter()
    ctx = adapter.init(load_config(overrides=["train.seed=0", "train.threads=1"]))
    torch.manual_seed(100 + ctx.rank)  # a different init on every rank: the broadcast must fix it
    model = make_model()
    dummy = ArrayDataset(np.zeros((2, FEATURES), np.float32), np.zeros(2, np.int64))
    task = TrainTask(model, torch.optim.SGD(model.parameters(), lr=LR), F.cross_entropy, dummy, dummy,
                     metric_sums=lambda out, y: {"correct": (out.argmax(1) == y).sum()})
    adapter.prepare(task, load_config(overrides=case_overrides(accumulation, fp16)))

    before = spread(hvd.allgather_object(flat(model)))
    adapter.broadcast_state()
    after = spread(hvd.allgather_object(flat(model)))
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    x_all, y_all, rng = global_batch(ctx.size, accumulation)
    adapter.set_learning_rate(LR)
    for i, idx in enumerate(micro_batches(ctx.rank, ctx.size, accumulation)):
        adapter.train_step(x_all[idx], y_all[idx], apply_update=i == accumulation - 1)
    update = (np.concatenate([v.double().reshape(-1).numpy() for v in initial.values()]) - flat(model)) / LR

    reference = make_model()
    reference.load_state_dict(initial)
    F.cross_entropy(reference(torch.from_numpy(x_all)), torch.from_numpy(y_all)).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()]).double().numpy()

    train_on_rank_specific_data(adapter, rng, ctx.rank)
    return ctx.rank, report(ctx, before, after, update, expected, spread(hvd.allgather_object(flat(model))))


run_cases(out_path, cases, run_case)
