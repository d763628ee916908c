"""Compression item: hvdtrain's torch PowerSGD against PyTorch's reference, DDP's ``powerSGD_hook``,
at the same rank and warm-up, in the same processes (a torch.distributed Gloo group over Horovod's
ranks, as item 2 builds it).

1. Bytes on the wire: steps on one fixed random batch (small_cnn, 32 per worker), socket bytes
   each rank writes per step (/proc/self/io ``wchar``) with hvdtrain (``comm.compression=powersgd``)
   and with DDP + ``powerSGD_hook``, after both are past the warm-up.
2. Accuracy: one epoch of real MNIST (``--samples`` images, the recipe's model, SGD momentum 0.9,
   the recipe's LR schedule computed by hvdtrain's own schedule for both) with hvdtrain's
   Trainer, then with DDP + the hook on the same arrays; validation accuracy on 10,000 test images.

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/workers/compression_ddp.py OUT.json --rank 4
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel

import common
import horovod.torch as hvd
from compression_bytes import wchar
from hvdtrain.tools.bench import BenchSettings
from hvdtrain.core.resolve import load_config
from hvdtrain.core.schedule import build_schedule
from hvdtrain.torch.adapter import TorchAdapter
from hvdtrain.torch.bench import synthetic_task, to_device
from hvdtrain_recipes.image_classification.torch_models import build_model

WARMUP, STEPS = 12, 6


def ddp_model(model: torch.nn.Module, rank: int, start: int, min_rate: float) -> DistributedDataParallel:
    # One bucket (small_cnn is 8.5 MB): with several, the hook chains each bucket's collectives from
    # Gloo's completion callbacks, whose order differs across ranks (a Gloo size mismatch, measured);
    # one bucket is also how hvdtrain sends its P's and Q's, one grouped allreduce each.
    ddp = DistributedDataParallel(model, bucket_cap_mb=64)  # distributed
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=start,
                               min_compression_rate=min_rate, orthogonalization_epsilon=1e-8)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    return ddp


def bytes_hvdtrain(overrides: list[str]) -> float:
    config = load_config(None, overrides=["model.name=small_cnn", "train.batch_size=32", "train.threads=1",
                                          "model.num_classes=10", *overrides], framework="torch")
    adapter = TorchAdapter()
    adapter.init(config)
    task = synthetic_task(config, BenchSettings(image_size=28, channels=1))
    adapter.prepare(task, config)
    adapter.broadcast_state()
    adapter.set_learning_rate(0.01)
    batch = to_device(adapter, task.train_data.inputs, task.train_data.targets)
    for _ in range(WARMUP):
        adapter.train_step(*batch)
    adapter.barrier()
    before = wchar()
    for _ in range(STEPS):
        adapter.train_step(*batch)
    return (wchar() - before) / STEPS


def bytes_ddp(rank: int, start: int, min_rate: float) -> float:
    torch.manual_seed(42)
    model = ddp_model(build_model("small_cnn", 1, (28, 28), 10), rank, start, min_rate)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(42)
    x = torch.from_numpy(rng.standard_normal((32, 1, 28, 28), dtype=np.float32))
    y = torch.from_numpy(rng.integers(0, 10, 32))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    dist.barrier()
    before = wchar()
    for _ in range(STEPS):
        step()
    return (wchar() - before) / STEPS


def accuracy_ddp(arrays, rank: int, start: int, min_rate: float, lr: float, batch: int) -> tuple[float, float]:
    x, y, xv, yv = arrays
    torch.manual_seed(42)
    model = ddp_model(build_model("small_cnn", 1, (28, 28), 10), rank, start, min_rate)
    config = load_config(None, overrides=[f"optim.lr={lr}", "optim.warmup_epochs=0.2"])
    steps = math.ceil(len(x) // dist.get_world_size() / batch)
    schedule = build_schedule(config.optim, dist.get_world_size(), steps, 1)
    opt = torch.optim.SGD(model.parameters(), lr=schedule(0), momentum=0.9)
    started = time.perf_counter()
    model.train()
    for i, idx in zip(range(steps), common.shard_batches(len(x), dist.get_rank(), dist.get_world_size(), batch)):
        for group in opt.param_groups:
            group["lr"] = schedule(i)
        opt.zero_grad()
        F.cross_entropy(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx])).backward()
        opt.step()
    elapsed = time.perf_counter() - started
    model.eval()
    with torch.no_grad():
        correct = sum(int((model.module(torch.from_numpy(xv[i:i + 500])).argmax(1) ==
                           torch.from_numpy(yv[i:i + 500])).sum()) for i in range(0, len(xv), 500))
    return correct / len(xv), elapsed


def accuracy_hvdtrain(arrays, overrides: list[str], lr: float, batch: int) -> tuple[float, float]:
    import hvdtrain

    recipe = common.register_memory_recipe({"torch": arrays})
    with tempfile.TemporaryDirectory() as out:
        config = hvdtrain.load_config(hvdtrain.get_recipe(recipe).defaults, recipe=recipe, framework="torch",
                                      overrides=[f"output={out}", "model.name=small_cnn", f"train.batch_size={batch}",
                                                 f"optim.lr={lr}", "train.threads=1", "train.log_every=0",
                                                 "checkpoint.enabled=false", "train.tensorboard=false",
                                                 "optim.warmup_epochs=0.2", "data.prefetch_batches=2", *overrides])
        result = hvdtrain.Trainer(config).fit()
    return result.final["val_accuracy"], result.final["epoch_time_sec"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--start", type=int, default=10, help="uncompressed warm-up steps, both sides")
    parser.add_argument("--samples", type=int, default=60000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--skip-accuracy", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides = ["comm.compression=powersgd", f"comm.powersgd_rank={args.rank}",
                 f"comm.powersgd_start_step={args.start}"]
    # DDP's hook compresses a matrix when (n + m) * r * min_rate < n * m; hvdtrain when n * m >= min_size.
    # min_rate=1 and min_size=0 compress the same matrices on small_cnn (every conv kernel and dense kernel).
    min_rate = 1.0
    overrides.append("comm.powersgd_min_size=0")
    wire_hvd = bytes_hvdtrain(overrides)
    common.init_torch_gloo_group(hvd, "bench.ddp_port")
    wire_ddp = bytes_ddp(args.rank, args.start, min_rate)
    record = {"rank": args.rank, "start": args.start, "wire_hvdtrain": wire_hvd, "wire_ddp": wire_ddp}
    if not args.skip_accuracy:
        arrays = common.mnist_arrays(args.samples, 10000)
        record["acc_hvdtrain"], record["time_hvdtrain"] = accuracy_hvdtrain(arrays, overrides, args.lr, args.batch)
        record["acc_ddp"], record["time_ddp"] = accuracy_ddp(arrays, args.rank, args.start, min_rate, args.lr,
                                                             args.batch)
    per_rank = hvd.allgather_object(record)  # distributed
    if hvd.rank() == 0:
        common.write_json(args.out, {"ranks": per_rank, "samples": args.samples, "batch": args.batch, "lr": args.lr})
        print(per_rank)


if __name__ == "__main__":
    main()
