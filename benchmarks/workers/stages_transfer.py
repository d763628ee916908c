"""Which Horovod collective carries a pipeline activation fastest between two ranks.

Run (4 workers = two 2-rank process sets exchanging at the same time, as two replicas do)::

    horovodrun -np 4 -H localhost:4 --gloo python benchmarks/workers/stages_transfer.py OUT.json

In each pair {0,1} and {2,3} the first rank sends a float32 activation to the second, through
``alltoall`` with splits (the receiver sends an empty tensor), ``allgather`` (the receiver
contributes an empty tensor), and ``broadcast`` (the receiver must already know the size: a
one-element size broadcast goes first, as a pipeline without fixed shapes needs). Methods
alternate round by round (order rotated) and the median time per transfer is reported per size.
"""

import json
import os
import statistics
import sys
import time

os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

SIZES = [16 * 1024, 256 * 1024, 2 * 1024 * 1024, 8 * 1024 * 1024]  # floats: 64 KiB .. 32 MiB
REPEATS, ROUNDS = 10, 7

hvd.init()
torch.set_num_threads(1)
pairs = [hvd.add_process_set([0, 1]), hvd.add_process_set([2, 3])]
rank = hvd.rank()
pset, sender = pairs[rank // 2], rank % 2 == 0
root = rank - rank % 2


def via_alltoall(x):
    send = x if sender else torch.empty(0)
    splits = torch.tensor([0, send.numel()] if sender else [0, 0], dtype=torch.int32)
    out, _ = hvd.alltoall(send, splits=splits, name="t.a2a", process_set=pset)
    return out


def via_allgather(x):
    return hvd.allgather(x if sender else torch.empty(0), name="t.ag", process_set=pset)


def via_broadcast(x):
    size = torch.tensor([x.numel() if sender else 0], dtype=torch.int64)
    hvd.broadcast_(size, root, name="t.bs", process_set=pset)
    buf = x if sender else torch.empty(int(size[0]))
    hvd.broadcast_(buf, root, name="t.b", process_set=pset)
    return buf


METHODS = {"alltoall": via_alltoall, "allgather": via_allgather, "broadcast": via_broadcast}
results = {}
for n in SIZES:
    x = torch.randn(n)
    times = {m: [] for m in METHODS}
    for r in range(ROUNDS):
        order = list(METHODS)[r % 3:] + list(METHODS)[:r % 3]
        for m in order:
            got = METHODS[m](x)  # warm-up / check
            if not sender:
                assert got.numel() == n, (m, got.numel())
            hvd.allreduce(torch.zeros(1), name="t.sync")
            start = time.perf_counter()
            for _ in range(REPEATS):
                METHODS[m](x)
            hvd.allreduce(torch.zeros(1), name="t.sync")
            if r:  # first round is warm-up
                times[m].append((time.perf_counter() - start) / REPEATS)
    results[n * 4] = {m: statistics.median(ts) * 1e3 for m, ts in times.items()}

if rank == 0:
    rows = {str(k): {**v, "fastest": min(v, key=v.get)} for k, v in results.items()}
    with open(sys.argv[1], "w") as f:
        json.dump({"ms_per_transfer_by_bytes": rows, "rounds": ROUNDS - 1, "repeats": REPEATS}, f, indent=1)
    for k, v in rows.items():
        print(k, {m: round(t, 3) for m, t in v.items() if m != "fastest"}, v["fastest"])
