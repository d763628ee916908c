"""Baseline: the usual alternative, ``torchrun`` + ``DistributedDataParallel`` over Gloo.

Same model (the image recipe's), data, batch, seed and sharding as the hvdtrain side; DDP overlaps
its bucketed gradient allreduce with the backward pass. One intra-op thread per rank.

    torchrun --standalone --nproc-per-node 2 benchmarks/ddp_torch_loop.py --samples 4096 --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import common
from hvdtrain_recipes.image_classification.torch_models import build_model


def train_steps(x: np.ndarray, y: np.ndarray, batch: int = common.BATCH, seed: int = common.SEED,
                model_name: str = common.MODEL) -> Iterator[None]:
    """Train on this rank's shard of ``x``, epoch after epoch, yielding after every step (the
    process group must exist: torchrun's environment, or the benchmark's own initialisation)."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = DistributedDataParallel(build_model(model_name, x.shape[1], (x.shape[2], x.shape[3]), 10))  # distributed
    optimizer = torch.optim.SGD(model.parameters(), lr=common.LR * dist.get_world_size(), momentum=0.9)
    model.train()
    # distributed: this rank's samples
    for idx in common.shard_batches(len(x), dist.get_rank(), dist.get_world_size(), batch, seed):
        optimizer.zero_grad()
        inputs, targets = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])  # as hvdtrain's ArrayDataset
        F.cross_entropy(model(inputs), targets).backward()  # distributed: bucketed allreduce overlaps backward
        optimizer.step()
        yield


def train_epoch(x: np.ndarray, y: np.ndarray, batch: int = common.BATCH, seed: int = common.SEED,
                model_name: str = common.MODEL) -> list[float]:
    """One epoch over this rank's shard of ``x``; returns the time each step ended."""
    ends = []
    for _ in itertools.islice(train_steps(x, y, batch, seed, model_name),
                              math.ceil(len(x) // dist.get_world_size() / batch)):
        ends.append(time.perf_counter())
    return ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=common.BATCH)
    parser.add_argument("--json", default=None, help="write {'rate': samples/s per worker} here (rank 0)")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # distributed
    x, y, _, _ = common.mnist_arrays(args.samples)
    rate = common.steady_rate(train_epoch(x, y, args.batch_size), args.batch_size)
    rates = [None] * dist.get_world_size()
    dist.all_gather_object(rates, rate)  # distributed
    if dist.get_rank() == 0:
        print(f"torchrun + DDP (gloo): {np.mean(rates):.1f} samples/s per worker on {len(rates)} worker(s)")
        if args.json:
            common.write_json(args.json, {"rate": float(np.mean(rates)), "rank_rates": rates,
                                          "world_size": len(rates)})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
