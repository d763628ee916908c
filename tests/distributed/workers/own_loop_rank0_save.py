"""Worker for tests/distributed/test_prepare.py: the DDP habit ``if rank == 0: save(...)`` in a loop
through ``hvdtrain.torch.prepare`` (``train.stall_timeout_sec=10``): rank 0 calls ``run.save`` at
update 2, rank 1 goes on to the next update's gradient exchange.

``python own_loop_rank0_save.py OUTPUT``, under ``horovodrun -np 2``.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from hvdtrain.torch import prepare


def main() -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    run = prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                  overrides=["train.batch_size=4", "train.stall_timeout_sec=10"])
    for _ in run.epochs(2):
        for x, y in run.data:
            F.cross_entropy(run.model(x), y).backward()
            run.optimizer.step()
            if run.rank == 0 and run.updates == 2:
                run.save(sys.argv[1])
    print("finished", flush=True)  # never: the job ends at rank 0's save


if __name__ == "__main__":
    main()
