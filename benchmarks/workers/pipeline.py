"""Items 5 and 6: the image recipe's input pipeline and checkpoint cost, on real MNIST PNGs.

Every round, in this process: (a) the loader alone, the same prefetching batch pipeline the
trainer uses, over this rank's shard; (b) one epoch of hvdtrain training on a subset with the
default checkpoint cadence (end of epoch), recording when each batch became ready, when each step
started and ended, and how long the checkpoint took; (c) on rank 0, the disk's write bandwidth
(the checkpoint's byte count written and fsynced in the same folder).

    horovodrun -np 2 -H localhost:2 python benchmarks/workers/pipeline.py OUT.json --rounds 5
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import common  # noqa: F401  (puts the repository on sys.path)
from timing import TimedAdapter, TimedDataset
import horovod.torch as hvd
import hvdtrain
from hvdtrain.core import sharding
from hvdtrain.core.adapter import load_adapter
from hvdtrain.core.prefetch import prefetch
from hvdtrain.core.registry import get_builder

RECIPE = "image-classification"
TIMED_RECIPE = "bench-image-timed"


def register_timed_recipe(datasets: list) -> None:
    """The image recipe with its training data wrapped in :class:`TimedDataset`."""
    build = get_builder(RECIPE, "torch")
    hvdtrain.define_recipe(TIMED_RECIPE, defaults=hvdtrain.get_recipe(RECIPE).defaults)

    @hvdtrain.register_recipe(TIMED_RECIPE, framework="torch")
    def build_timed(config, ctx):
        task = build(config, ctx)
        task.train_data = TimedDataset(task.train_data)
        datasets.append(task.train_data)
        return task


def loader_only(config, ctx, batches: int) -> float:
    """Samples/s of the trainer's pipeline (prefetch thread, decode, normalise) without training."""
    task = get_builder(RECIPE, "torch")(config, ctx)
    data = task.train_data
    idx = sharding.train_shard(len(data), ctx.rank, ctx.size, 0, config.train.seed, True, "pad")
    batch_list = sharding.batches(idx, config.train.batch_size)[:batches]
    started = time.perf_counter()
    n = sum(len(y) for _, y in prefetch(batch_list, lambda i: data.get_batch(i, 0), config.data.prefetch_batches))
    return n / (time.perf_counter() - started)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def disk_write_seconds(directory: Path, nbytes: int) -> float:
    """Time to write ``nbytes`` into a new file in ``directory`` and fsync it."""
    payload = np.random.default_rng(0).bytes(nbytes)
    path = directory / f".disk-probe-{os.getpid()}"
    started = time.perf_counter()
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=3072)
    parser.add_argument("--workdir", default=None, help="where checkpoints are written (default: a temp dir)")
    args = parser.parse_args()
    datasets: list = []
    register_timed_recipe(datasets)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-", dir=args.workdir) as tmp:
        for r in range(args.rounds + 1):  # round 0 warms up (and builds the PNG cache) and is dropped
            overrides = common.hvdtrain_overrides(f"{tmp}/round{r}", **{
                "data.max_train_samples": args.samples, "data.max_val_samples": 256, "checkpoint.enabled": True})
            config = hvdtrain.load_config(hvdtrain.get_recipe(RECIPE).defaults, overrides=overrides,
                                          recipe=TIMED_RECIPE, framework="torch")
            adapter = TimedAdapter(load_adapter("torch"))
            trainer = hvdtrain.Trainer(config, adapter=adapter)
            result = trainer.fit()  # its epoch record times the epoch-end checkpoint (gather + write)
            ctx = trainer.ctx
            ready, starts, ends = datasets[-1].ready, adapter.starts, adapter.ends
            skip = common.SKIP_STEPS
            window = ends[-1] - ends[skip]
            waits = [max(0.0, ready[i] - ends[i - 1]) for i in range(skip + 1, len(ends))]
            gaps = [starts[i] - ends[i - 1] for i in range(skip + 1, len(ends))]
            record = {"train_rate": common.steady_rate(ends, config.train.batch_size),
                      "data_wait_share": sum(waits) / window, "between_steps_share": sum(gaps) / window,
                      "loader_rate": loader_only(config, ctx, len(ends)),
                      "checkpoint_sec": result.final["checkpoint_sec"]}
            if ctx.is_main:
                checkpoint = Path(config.output) / "checkpoints" / "epoch-0001"
                record["checkpoint_bytes"] = dir_bytes(checkpoint)
                record["disk_write_sec"] = disk_write_seconds(checkpoint.parent, record["checkpoint_bytes"])
            per_rank = hvd.allgather_object(record)  # distributed
            if r and ctx.is_main:
                rounds.append(per_rank)
                print(f"round {r}: " + ", ".join(f"{k} {v:.4g}" for k, v in per_rank[0].items()), flush=True)
    if hvd.rank() == 0:
        common.write_json(args.out, {"world_size": hvd.size(), "batch": common.BATCH, "samples": args.samples,
                                     "full_epoch_samples": 60000, "rank_rounds": rounds})


if __name__ == "__main__":
    main()
