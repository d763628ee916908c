"""Items 4 and 7: hvdtrain's gradient allreduce against raw ``hvd.allreduce``, and fp16 compression.

One process per rank holds three hvdtrain torch adapters on the same model (fp32 gradients with
hvdtrain's defaults, fp16-compressed gradients, and fp32 with ``comm.overlap=always`` when the
default resolves to ``never`` on this machine) and
alternates, every round: steps with each, raw ``hvd.allreduce`` of
one buffer as large as all gradients together, PyTorch's own Gloo ``all_reduce`` of that buffer (a
torch.distributed group over the same processes: what DDP uses), and a memory copy of that size.
Horovod's timeline
(comm.timeline) records every collective with its dtype and shape; the driver reads it afterwards.
Bytes this process wrote to its Gloo sockets (/proc/self/io ``wchar``) are counted per step.

    horovodrun -np 2 -H localhost:2 python benchmarks/workers/allreduce.py OUT.json TIMELINE.json --rounds 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import common  # noqa: F401  (puts the repository on sys.path)
import horovod.torch as hvd
from hvdtrain.tools.bench import BenchSettings
from hvdtrain.core.resolve import load_config
from hvdtrain.torch.adapter import TorchAdapter
from hvdtrain.torch.bench import synthetic_task, to_device

RAW_NAME = "bench.raw_allreduce"
TORCH_CALLS = 8
STEPS, RAW_CALLS, COPIES = 4, 4, 20


def wchar() -> int:
    """Bytes this process has passed to write()/writev() so far (Gloo sends with writev)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def make_side(fp16: bool, timeline: str, overlap: str | None = None):
    overrides = [f"model.name={common.MODEL}", f"train.batch_size={common.BATCH}", "train.threads=1",
                 f"train.fp16_allreduce={fp16}", f"comm.timeline={timeline}", "model.num_classes=10"]
    if overlap:
        overrides.append(f"comm.overlap={overlap}")
    config = load_config(None, overrides=overrides, framework="torch")
    adapter = TorchAdapter()
    adapter.init(config)
    task = synthetic_task(config, BenchSettings(image_size=28, channels=1))
    adapter.prepare(task, config)
    adapter.broadcast_state()
    adapter.set_learning_rate(0.01)
    batch = to_device(adapter, task.train_data.inputs, task.train_data.targets)
    return adapter, batch, sum(p.numel() for p in adapter.model.parameters())


def run_steps(adapter, batch) -> dict:
    """STEPS training steps: samples/s and socket bytes written per step."""
    adapter.train_step(*batch)
    before, started = wchar(), time.perf_counter()
    for _ in range(STEPS):
        adapter.train_step(*batch)
    elapsed, written = time.perf_counter() - started, wchar() - before
    return {"rate": STEPS * common.BATCH / elapsed, "wire_bytes_per_step": written / STEPS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("timeline")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sides = {"fp32": make_side(False, args.timeline), "fp16": make_side(True, args.timeline)}
    default_overlap = sides["fp32"][0].overlap  # what comm.overlap=auto resolved to here
    if not default_overlap:
        sides["fp32_always"] = make_side(False, args.timeline, overlap="always")
    params = sides["fp32"][2]
    raw = torch.randn(params)
    common.init_torch_gloo_group(hvd, "bench.torch_port")
    import torch.distributed as dist

    src, dst = np.random.default_rng(0).standard_normal(params).astype(np.float32), np.empty(params, np.float32)
    rounds = []
    for r in range(args.rounds + 1):  # round 0 warms up and is dropped
        record = {}
        for name in (list(sides) if r % 2 else list(sides)[::-1]):
            adapter, batch, _ = sides[name]
            record[name] = run_steps(adapter, batch)
        started = time.perf_counter()
        for _ in range(RAW_CALLS):
            hvd.allreduce(raw, name=RAW_NAME)  # distributed: the raw reference
        record["raw_wall_sec"] = (time.perf_counter() - started) / RAW_CALLS
        walls = {"horovod": [], "torch": []}
        for _ in range(TORCH_CALLS):  # wall time of one in-place allreduce each, interleaved
            hvd.allreduce_(raw, name=RAW_NAME + "_inplace")  # distributed
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(raw)  # distributed: PyTorch's Gloo
            walls["torch"].append(time.perf_counter() - started)
            dist.barrier()
            started = time.perf_counter()
            hvd.allreduce_(raw, name=RAW_NAME + "_inplace")  # distributed: Horovod's Gloo
            walls["horovod"].append(time.perf_counter() - started)
        record["inplace_wall_sec"] = {k: sorted(v)[len(v) // 2] for k, v in walls.items()}
        started = time.perf_counter()
        for _ in range(COPIES):
            np.copyto(dst, src)
        record["memcpy_sec"] = (time.perf_counter() - started) / COPIES
        if r:
            rounds.append(record)
    per_rank = hvd.allgather_object(rounds)  # distributed
    if hvd.rank() == 0:
        common.write_json(args.out, {"world_size": hvd.size(), "params": params, "gradient_bytes": 4 * params,
                                     "steps_per_round": STEPS, "raw_calls_per_round": RAW_CALLS,
                                     "raw_name": RAW_NAME, "default_overlap": default_overlap,
                                     "rank_rounds": per_rank})
    hvd.shutdown()  # flush and close the timeline


if __name__ == "__main__":
    main()
