"""Item 3: synthetic throughput per worker of hvdtrain's adapter (what `hvdtrain bench` runs) and of
the hand-written loop (Horovod's synthetic benchmark), blocks of steps interleaved.

Both sides train the same model on a fixed random batch made the same way, one thread per rank.
The driver starts this at np=1 and np=2 (alternating launches) and computes scaling efficiency.

    horovodrun -np 2 -H localhost:2 python benchmarks/workers/scaling.py OUT.json
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import common  # noqa: F401  (puts the repository on sys.path)
import horovod.torch as hvd
import horovod_torch_loop
from hvdtrain.tools.bench import BenchSettings
from hvdtrain.core.resolve import load_config
from hvdtrain.torch.adapter import TorchAdapter
from hvdtrain.torch.bench import synthetic_task, to_device

IMAGE, CHANNELS, WARMUP, PER_BLOCK = 28, 1, 3, 3


def hvdtrain_steps():
    """hvdtrain's side, built exactly as `hvdtrain bench` builds it, one step per iteration."""
    config = load_config(None, overrides=[f"model.name={common.MODEL}", f"train.batch_size={common.BATCH}",
                                          "train.threads=1", f"train.seed={common.SEED}"], framework="torch")
    adapter = TorchAdapter()
    adapter.init(config)
    task = synthetic_task(config, BenchSettings(IMAGE, CHANNELS))
    adapter.prepare(task, config)
    adapter.broadcast_state()
    adapter.set_learning_rate(config.optim.lr)
    inputs, targets = to_device(adapter, task.train_data.inputs, task.train_data.targets)
    while True:
        adapter.train_step(inputs, targets)
        yield


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--blocks", type=int, default=8, help=f"timed blocks of {PER_BLOCK} steps per side")
    args = parser.parse_args()
    sides = {"hvdtrain": hvdtrain_steps(),
             "baseline": horovod_torch_loop.synthetic_steps(common.MODEL, common.BATCH, IMAGE, CHANNELS,
                                                            prefix="baseline.")}
    for steps in sides.values():
        for _ in itertools.islice(steps, WARMUP):
            pass
    rates = {name: [] for name in sides}
    for b in range(args.blocks):
        for name in (list(sides) if b % 2 == 0 else list(sides)[::-1]):
            started = time.perf_counter()
            for _ in itertools.islice(sides[name], PER_BLOCK):
                pass
            rates[name].append(common.BATCH * PER_BLOCK / (time.perf_counter() - started))
    per_rank = hvd.allgather_object({k: statistics.median(v) for k, v in rates.items()})  # distributed
    if hvd.rank() == 0:
        result = {k: statistics.fmean(p[k] for p in per_rank) for k in rates}
        print(f"np={hvd.size()}: " + ", ".join(f"{k} {v:.1f}" for k, v in result.items()), flush=True)
        common.write_json(args.out, {"world_size": hvd.size(), "rounds": [result]})


if __name__ == "__main__":
    main()
