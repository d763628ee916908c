"""PyTorch data parallelism's gradient exchange, A/B step by step in one job (issue 27 item 3):
hvdtrain's TorchAdapter with ``comm.flat_gradients=true`` (flat buffers, one in-place allreduce
per update: the default without overlap) and ``false`` (Horovod's DistributedOptimizer, one fused
allreduce), next to the hand-written Horovod loop and DistributedDataParallel over Gloo. Same model
(the image recipe's small_cnn), data, batch and seed; the sides take turns step by step (the order
rotating every step), so the machine's load hits them alike.

Per side: samples/s per worker over the timed steps, and CPU milliseconds per step (user+sys of
the process, Horovod's and Gloo's threads included: what load on a shared machine does not
distort). Horovod's tuning variables (``HOROVOD_CYCLE_TIME``, ``HOROVOD_FUSION_THRESHOLD``,
``HOROVOD_CACHE_CAPACITY``) apply to every Horovod side alike; set them around the job to sweep.

    PYTHONPATH=benchmarks horovodrun -np 2 -H localhost:2 --gloo python benchmarks/workers/flat_exchange.py OUT.json --steps 200
"""

from __future__ import annotations

import argparse
import os
import time

import common  # noqa: F401  (puts the repository on sys.path)
import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from common import BATCH, LR, MODEL, SEED, cpu_seconds, mnist_arrays

from hvdtrain import ArrayDataset, TrainTask, load_config
from hvdtrain.torch import TorchAdapter
from hvdtrain_recipes.image_classification.torch_models import build_model

TUNING = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CACHE_CAPACITY")


def adapter_steps(x: np.ndarray, y: np.ndarray, flat: bool):
    """hvdtrain's adapter training this rank's shard, one step per ``next``."""
    overrides = [f"train.seed={SEED}", "train.threads=1", f"comm.flat_gradients={str(flat).lower()}",
                 "optim.name=sgd", "optim.momentum=0.9", f"optim.lr={LR}"]
    adapter = TorchAdapter()
    adapter.init(load_config(overrides=overrides))
    torch.manual_seed(SEED)
    model = build_model(MODEL, x.shape[1], (x.shape[2], x.shape[3]), 10)
    dummy = ArrayDataset(x[:2], y[:2])
    task = TrainTask(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), F.cross_entropy, dummy, dummy,
                     lambda out, target: {})
    adapter.prepare(task, load_config(overrides=overrides))
    adapter.broadcast_state()
    adapter.set_learning_rate(LR * hvd.size())
    for idx in common.shard_batches(len(x), hvd.rank(), hvd.size(), BATCH, SEED):  # distributed
        adapter.train_step(x[idx], y[idx])
        yield



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per side")
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps per side, not timed")
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()
    import ddp_torch_loop
    import horovod_torch_loop

    x, y, _, _ = mnist_arrays(args.samples)
    hvd.init()  # distributed
    common.init_torch_gloo_group(hvd, "bench.ddp_port")
    sides = {"flat": adapter_steps(x, y, True), "distributed_optimizer": adapter_steps(x, y, False),
             "baseline": horovod_torch_loop.train_steps(x, y, prefix="baseline."),
             "ddp": ddp_torch_loop.train_steps(x, y)}
    wall = {name: [] for name in sides}
    cpu = {name: [] for name in sides}
    names = list(sides)
    for step in range(args.skip + args.steps):
        order = names[step % len(names):] + names[:step % len(names)]
        for name in order:
            c0, t0 = cpu_seconds(), time.perf_counter()
            next(sides[name])
            if step >= args.skip:
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(cpu_seconds() - c0)
    rates = {name: BATCH * len(t) / sum(t) for name, t in wall.items()}
    cpu_ms = {name: 1000 * sum(c) / len(c) for name, c in cpu.items()}
    per_rank = hvd.allgather_object({"rates": rates, "cpu_ms": cpu_ms})  # distributed
    if hvd.rank() == 0:
        result = {"world_size": hvd.size(), "steps": args.steps, "batch": BATCH, "model": MODEL,
                  "horovod_env": {k: os.environ[k] for k in TUNING if k in os.environ},
                  "samples_per_sec": {n: float(np.mean([r["rates"][n] for r in per_rank])) for n in names},
                  "cpu_ms_per_step": {n: float(np.mean([r["cpu_ms"][n] for r in per_rank])) for n in names}}
        s, c = result["samples_per_sec"], result["cpu_ms_per_step"]
        print(f"env {result['horovod_env']}: " + ", ".join(f"{n} {s[n]:.1f}/s {c[n]:.1f} ms CPU" for n in names)
              + f"; flat/distributed_optimizer {s['flat'] / s['distributed_optimizer']:.3f}, "
              f"flat/ddp {s['flat'] / s['ddp']:.3f}, baseline/ddp {s['baseline'] / s['ddp']:.3f}", flush=True)
        common.write_json(args.out, result)


if __name__ == "__main__":
    main()
