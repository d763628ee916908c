"""Baseline: a minimal hand-written Horovod + PyTorch training loop (what hvdtrain must not be slower than).

The loop of Horovod's own PyTorch examples: DistributedOptimizer, broadcast from rank 0, each rank
trains on its shard of a seeded permutation. Same model (the image recipe's), data, batch and
seed as the hvdtrain side; one intra-op thread per rank.

    horovodrun -np 2 -H localhost:2 python benchmarks/horovod_torch_loop.py --samples 4096
    horovodrun -np 2 -H localhost:2 python benchmarks/horovod_torch_loop.py --synthetic --steps 20

With ``--synthetic`` it is Horovod's own ``pytorch_synthetic_benchmark.py`` (fixed random batch,
warm-up, timed iterations; on the GPU when there is one; ``--amp`` adds autocast + GradScaler).
"""

from __future__ import annotations

import argparse
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import common
from recipes.image_classification.torch_models import build_model


def device() -> torch.device:
    """This rank's GPU if there is one, else the CPU."""
    return torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")


def setup(model_name: str, in_channels: int, size: int, classes: int, lr: float, seed: int, fp16: bool = False):
    """Horovod, one thread, the model and its DistributedOptimizer, state broadcast from rank 0."""
    hvd.init()  # distributed
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.set_device(device())
    model = build_model(model_name, in_channels, (size, size), classes).to(device())
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(  # distributed
        optimizer, named_parameters=model.named_parameters(),
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


def train_epoch(x: np.ndarray, y: np.ndarray, batch: int = common.BATCH, seed: int = common.SEED,
                model_name: str = common.MODEL) -> list[float]:
    """One epoch over this rank's shard of ``x``; returns the time each step ended."""
    model, optimizer = setup(model_name, x.shape[1], x.shape[2], 10, common.LR, seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    shard = order[hvd.rank()::hvd.size()]  # distributed: this rank's samples
    model.train()
    ends = []
    for start in range(0, len(shard), batch):
        idx = shard[start:start + batch]
        step(model, optimizer, xt[idx], yt[idx])
        ends.append(time.perf_counter())
    return ends


def synthetic(model_name: str, batch: int, size: int, channels: int, warmup: int, steps_per_iter: int,
              iters: int, seed: int = common.SEED, amp: bool = False) -> list[float]:
    """Horovod's synthetic benchmark: a fixed random batch; returns samples/s of each iteration."""
    model, optimizer = setup(model_name, channels, size, 1000, 0.01, seed)
    x = torch.randn(batch, channels, size, size, device=device())
    y = torch.randint(0, 1000, (batch,), device=device())
    scaler = torch.amp.GradScaler("cuda") if amp else None
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        step(model, optimizer, x, y, scaler)
    rates = []
    for _ in range(iters):
        sync()
        started = time.perf_counter()
        for _ in range(steps_per_iter):
            step(model, optimizer, x, y, scaler)
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
