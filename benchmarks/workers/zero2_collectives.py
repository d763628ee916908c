"""Where ZeRO-2's exchange spends its time on CPUs (issue 26): the ways of leaving each rank the
averaged 1/N slice of one flat gradient buffer, timed interleaved in one job (A, B, C, A, B, C...):

* ``reducescatter_pieces``: hvdtrain's former exchange, Horovod's reduce-scatter in column blocks
  of ``--piece`` elements (each block copied contiguous first), the slices copied out;
* ``reducescatter_whole``: one reduce-scatter of the whole buffer;
* ``allreduce_slice``: one in-place allreduce of the whole buffer, this rank's slice cloned (the
  CPU exchange now);
* ``allgather_params``: one allgather of this rank's updated slice into the whole buffer (what
  ZeRO-1 and ZeRO-2 add to data parallelism's allreduce every update);
* ``allgather_into``: the same allgather written into one kept whole buffer (where the parameters
  can live: no new buffer per update);
* ``realloc_huge``: the same on huge pages (:func:`hvdtrain.torch.host_memory.huge_page_zeros`, written
  once so its pages are faulted in as the backward pass would);
* ``realloc``: allocating the zeroed buffer again (what freeing it after the exchange costs) and
  ``rezero``: zeroing the kept buffer instead.

Run it under each controller (``--gloo``, ``--mpi``): which way is cheaper depends on it.
Per variant: median wall ms and CPU ms (user+sys of the process, Horovod's threads included; load
on a shared machine does not distort it) per call, rank 0 printing and writing ``OUT`` (JSON).

    PYTHONPATH=benchmarks horovodrun -np 2 -H localhost:2 --gloo python benchmarks/workers/zero2_collectives.py OUT.json \\
        --elements 22700000 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import horovod.torch as hvd
import torch
from common import cpu_seconds

from hvdtrain.torch.host_memory import huge_page_zeros  # benchmarks/ on PYTHONPATH, as for every worker



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--elements", type=int, default=22_700_000, help="buffer size (MiniLM: about 22.7 M)")
    parser.add_argument("--piece", type=int, default=1 << 22, help="reduce-scatter piece, elements")
    parser.add_argument("--rounds", type=int, default=6, help="first round is warm-up, not counted")
    args = parser.parse_args()
    hvd.init()  # distributed
    torch.set_num_threads(1)
    size, rank = hvd.size(), hvd.rank()
    shard = -(-args.elements // size)
    padded = shard * size
    flat = torch.randn(padded)

    def reducescatter_pieces() -> torch.Tensor:
        rows, out = flat.view(size, shard), torch.empty(shard)
        width = max(1, args.piece // size)
        for start in range(0, shard, width):
            got = hvd.reducescatter(rows[:, start:start + width].contiguous(), op=hvd.Average,  # distributed
                                    name=f"bench.piece.{start}")
            out[start:start + width] = got.reshape(-1)
        return out

    def reducescatter_whole() -> torch.Tensor:
        return hvd.reducescatter(flat, op=hvd.Average, name="bench.whole")  # distributed

    def allreduce_slice() -> torch.Tensor:
        hvd.allreduce_(flat, op=hvd.Average, name="bench.allreduce")  # distributed
        return flat[rank * shard:(rank + 1) * shard].clone()

    mine = flat[rank * shard:(rank + 1) * shard].clone()

    def allgather_params() -> torch.Tensor:
        return hvd.allgather(mine, name="bench.allgather")  # distributed

    params = torch.zeros(padded)

    def allgather_into() -> torch.Tensor:
        from horovod.torch.mpi_ops import _allgather_async, global_process_set
        return hvd.synchronize(_allgather_async(mine, params, "bench.allgather_into", global_process_set))

    variants = {"reducescatter_pieces": reducescatter_pieces, "reducescatter_whole": reducescatter_whole,
                "allreduce_slice": allreduce_slice, "allgather_params": allgather_params,
                "allgather_into": allgather_into,
                "realloc_huge": lambda: huge_page_zeros(padded, torch.float32).zero_(), "realloc": lambda: torch.zeros(padded),
                "rezero": lambda: flat.zero_()}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, run in variants.items():
            hvd.allreduce(torch.zeros(1), name="bench.barrier")  # distributed: start together
            c0, t0 = cpu_seconds(), time.perf_counter()
            run()
            if r:
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(cpu_seconds() - c0)
    controller = "mpi" if hvd.mpi_enabled() else "gloo"
    result = {"controller": controller, "elements": padded, "world_size": size, "piece": args.piece, "rounds": args.rounds - 1,
              "variants": {k: {"wall_ms": [1000 * t for t in wall[k]], "cpu_ms": [1000 * t for t in cpu[k]],
                               "median_wall_ms": 1000 * statistics.median(wall[k]),
                               "median_cpu_ms": 1000 * statistics.median(cpu[k])} for k in variants}}
    if rank == 0:
        print(f"controller {controller}, {size} ranks, {padded} elements", flush=True)
        for name, v in result["variants"].items():
            print(f"{name}: median {v['median_wall_ms']:.1f} ms wall, {v['median_cpu_ms']:.1f} ms CPU per call",
                  flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
