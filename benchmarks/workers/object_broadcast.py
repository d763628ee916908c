"""Object broadcast: Horovod's ``broadcast_object`` against hvdtrain's ``broadcast_pickled`` (torch).

Run under ``horovodrun -np 2 -H localhost:2 --gloo python benchmarks/workers/object_broadcast.py
[ROUNDS]``. Each round broadcasts a dict of float32 arrays (what a checkpoint's model and optimizer
state is) of 1, 8 and 32 MB from rank 0 both ways, the two methods in turn; rank 0 prints the
median seconds per broadcast and their ratio.
"""

import statistics
import sys
import time

import horovod.torch as hvd
import numpy as np
import torch

from hvdtrain.core.collectives import broadcast_pickled

hvd.init()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
for megabytes in (1, 8, 32):
    state = {f"layer{i}": np.random.default_rng(i).standard_normal(megabytes * 2**18 // 4, dtype=np.float32)
             for i in range(4)} if hvd.rank() == 0 else None
    times = {"horovod": [], "hvdtrain": []}
    for r in range(rounds):
        for method in times:
            hvd.allreduce(torch.zeros(1), name=f"sync.{megabytes}.{r}.{method}")
            started = time.perf_counter()
            if method == "horovod":
                got = hvd.broadcast_object(state, 0, name=f"h.{megabytes}.{r}")
            else:
                got = broadcast_pickled(hvd, torch.from_numpy, state, 0, f"p.{megabytes}.{r}")
            times[method].append(time.perf_counter() - started)
            assert sum(a.nbytes for a in got.values()) == megabytes * 2**20
    if hvd.rank() == 0:
        old, new = (statistics.median(times[m]) for m in ("horovod", "hvdtrain"))
        print(f"{megabytes:3d} MB: hvd.broadcast_object {old:.3f} s, broadcast_pickled {new:.4f} s, "
              f"ratio {new / old:.4f} (median of {rounds} rounds)", flush=True)
