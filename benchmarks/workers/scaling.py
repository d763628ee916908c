"""Item 3: synthetic throughput per worker of `hvdtrain bench` and of the hand-written loop.

Both sides run in this process, alternating, on the same model, fixed batch and thread count.
The driver starts this at np=1 and np=2 (alternating launches) and computes scaling efficiency.

    horovodrun -np 2 -H localhost:2 python benchmarks/workers/scaling.py OUT.json --rounds 1
"""

from __future__ import annotations

import argparse
import statistics

import common  # noqa: F401  (puts the repository on sys.path)
import horovod.torch as hvd
import horovod_torch_loop
from hvdtrain.core.bench import BenchSettings, run_bench
from hvdtrain.core.config import load_config

IMAGE, CHANNELS, WARMUP, PER_ITER, ITERS = 28, 1, 2, 4, 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=1, help="measured rounds (after one warm-up round)")
    args = parser.parse_args()
    config = load_config(None, overrides=[f"model.name={common.MODEL}", f"train.batch_size={common.BATCH}",
                                          "train.threads=1", f"train.seed={common.SEED}"], framework="torch")
    settings = BenchSettings(IMAGE, CHANNELS, WARMUP, PER_ITER, ITERS)
    rounds = []
    for r in range(args.rounds + 1):  # round 0 warms up and is dropped
        rates = {}
        for side in (("hvdtrain", "baseline") if r % 2 == 0 else ("baseline", "hvdtrain")):
            if side == "hvdtrain":
                result, _ = run_bench(config, settings)
                rates[side] = result.per_worker.mean
            else:
                mine = horovod_torch_loop.synthetic(common.MODEL, common.BATCH, IMAGE, CHANNELS, WARMUP, PER_ITER, ITERS)
                rates[side] = statistics.fmean(r for rank in hvd.allgather_object(mine) for r in rank)  # distributed
        if r:
            rounds.append(rates)
        if hvd.rank() == 0:
            print(f"np={hvd.size()} round {r}: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()), flush=True)
    if hvd.rank() == 0:
        common.write_json(args.out, {"world_size": hvd.size(), "rounds": rounds})


if __name__ == "__main__":
    main()
