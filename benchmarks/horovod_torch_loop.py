"""Baseline: a minimal hand-written Horovod + PyTorch training loop (what hvdtrain must not be slower than).

The loop of Horovod's own PyTorch examples: DistributedOptimizer, broadcast from rank 0, each rank
trains on its shard of a seeded permutation. Same model (the image recipe's), data, batch and
seed as the hvdtrain side; one intra-op thread per rank. Batches are NumPy-indexed and wrapped with
``torch.from_numpy``, as hvdtrain's ``ArrayDataset`` does: on the benchmark machine, indexing a
torch tensor instead made the following forward pass up to 2x slower, which would flatter hvdtrain.

    horovodrun -np 2 -H localhost:2 python benchmarks/horovod_torch_loop.py --samples 4096
    horovodrun -np 2 -H localhost:2 python benchmarks/horovod_torch_loop.py --synthetic --steps 20

With ``--synthetic`` it is Horovod's own ``pytorch_synthetic_benchmark.py`` (fixed random batch,
warm-up, timed iterations; on the GPU when there is one; ``--amp`` adds autocast + GradScaler).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from typing import Iterator

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import common
from hvdtrain_recipes.image_classification.torch_models import build_model


def device() -> torch.device:
    """This rank's GPU if there is one, else the CPU."""
    return torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")


def setup(model_name: str, in_channels: int, size: int, classes: int, lr: float, seed: int, fp16: bool = False,
          prefix: str = ""):
    """Horovod, one thread, the model and its DistributedOptimizer, state broadcast from rank 0."""
    hvd.init()  # distributed
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.set_device(device())
    model = build_model(model_name, in_channels, (size, size), classes).to(device())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(  # distributed
        optimizer, named_parameters=[(prefix + name, p) for name, p in model.named_parameters()],
        compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # distributed
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # distributed
    return model, optimizer


def step(model, optimizer, x, y, scaler=None) -> None:
    """One training step (with a GradScaler: autocast fp16, as in Horovod's AMP example)."""
    optimizer.zero_grad()
    if scaler is None:
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        return
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    optimizer.synchronize()  # distributed: finish the allreduce before unscaling
    scaler.unscale_(optimizer)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()


def train_steps(x: np.ndarray, y: np.ndarray, batch: int = common.BATCH, seed: int = common.SEED,
                model_name: str = common.MODEL, prefix: str = "") -> Iterator[None]:
    """Train on this rank's shard of ``x``, epoch after epoch, yielding after every step (so the
    benchmark can interleave it with hvdtrain's steps). ``prefix`` renames the Horovod tensors."""
    model, optimizer = setup(model_name, x.shape[1], x.shape[2], 10, common.LR, seed, prefix=prefix)
    model.train()
    for idx in common.shard_batches(len(x), hvd.rank(), hvd.size(), batch, seed):  # distributed: this rank's samples
        step(model, optimizer, torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))  # as hvdtrain's ArrayDataset
        yield


def train_epoch(x: np.ndarray, y: np.ndarray, batch: int = common.BATCH, seed: int = common.SEED,
                model_name: str = common.MODEL) -> list[float]:
    """One epoch over this rank's shard of ``x``; returns the time each step ended."""
    steps = train_steps(x, y, batch, seed, model_name)
    next(steps)  # the first step also initialises Horovod and builds the model
    ends = [time.perf_counter()]
    for _ in itertools.islice(steps, math.ceil(len(x) // hvd.size() / batch) - 1):
        ends.append(time.perf_counter())
    return ends


def synthetic_steps(model_name: str, batch: int, size: int, channels: int, seed: int = common.SEED,
                    amp: bool = False, prefix: str = "") -> Iterator[None]:
    """Horovod's synthetic benchmark loop: the same fixed random batch, step after step (yields after each)."""
    model, optimizer = setup(model_name, channels, size, 1000, 0.01, seed, prefix=prefix)
    rng = np.random.default_rng(seed)  # the batch is made as `hvdtrain bench` makes it
    x = torch.from_numpy(rng.standard_normal((batch, channels, size, size), dtype=np.float32)).to(device())
    y = torch.from_numpy(rng.integers(0, 1000, size=batch, dtype=np.int64)).to(device())
    scaler = torch.amp.GradScaler("cuda") if amp else None
    while True:
        step(model, optimizer, x, y, scaler)
        yield


def synthetic(model_name: str, batch: int, size: int, channels: int, warmup: int, steps_per_iter: int,
              iters: int, seed: int = common.SEED, amp: bool = False) -> list[float]:
    """Horovod's synthetic benchmark: warm-up, then samples/s of each timed iteration."""
    steps = synthetic_steps(model_name, batch, size, channels, seed, amp)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    next(steps)  # builds the model (not timed)
    for _ in itertools.islice(steps, warmup):
        pass
    rates = []
    for _ in range(iters):
        sync()
        started = time.perf_counter()
        for _ in itertools.islice(steps, steps_per_iter):
            pass
        sync()
        rates.append(batch * steps_per_iter / (time.perf_counter() - started))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--model", default=common.MODEL)
    parser.add_argument("--batch-size", type=int, default=common.BATCH)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="--synthetic: batches per timed iteration")
    parser.add_argument("--warmup", type=int, default=2, help="--synthetic: warm-up batches")
    parser.add_argument("--iters", type=int, default=5, help="--synthetic: timed iterations")
    parser.add_argument("--amp", action="store_true", help="--synthetic on a GPU: autocast fp16 + GradScaler")
    parser.add_argument("--json", default=None, help="--synthetic: write every rank's rates here (rank 0)")
    args = parser.parse_args()
    if args.synthetic:
        rates = synthetic(args.model, args.batch_size, args.image_size, args.channels, args.warmup, args.steps,
                          args.iters, amp=args.amp)
        rate = float(np.mean(rates))
        everyone = hvd.allgather_object(rates)  # distributed
        if hvd.rank() == 0 and args.json:
            common.write_json(args.json, {"model": args.model, "batch": args.batch_size, "image_size": args.image_size,
                                          "amp": args.amp, "world_size": hvd.size(), "rank_rates": everyone,
                                          "device": str(device()), "per_worker": float(np.mean(everyone)),
                                          "total": float(sum(np.mean(r) for r in everyone))})
    else:
        x, y, _, _ = common.mnist_arrays(args.samples)
        rate = common.steady_rate(train_epoch(x, y, args.batch_size, model_name=args.model), args.batch_size)
    if hvd.rank() == 0:
        print(f"horovod torch loop: {rate:.1f} samples/s per worker on {hvd.size()} worker(s)")


if __name__ == "__main__":
    main()
