"""A 4-rank job for tests/reliability/test_compression_resume.py: every rank's gradient-exchange
state is gathered for a checkpoint (hvdtrain.core.compression_state.gather, the call the trainer's
checkpoint makes) and each rank prints, as one JSON line, the peak extra memory (RSS high-water
mark above what it held before) and whether it received the whole job's state.

Usage: horovodrun -np 4 python gather_memory_job.py MEGABYTES
"""

from __future__ import annotations

import json
import resource
import sys

import horovod.torch as hvd
import numpy as np
import torch

from hvdtrain.core import compression_state
from hvdtrain.core.adapter import DistContext
from hvdtrain.core.collectives import Collectives


class Exchange:
    """An error-feedback exchange's state: ``megabytes`` of float32 buffers, different per rank."""

    keeps_state = True

    def __init__(self, megabytes: int, rank: int):
        n = megabytes * (1 << 20) // 4 // 4
        self.buffers = {f"error.{i}": np.full(n, rank + i / 10, dtype=np.float32) for i in range(4)}

    def state(self) -> dict[str, np.ndarray]:
        return dict(self.buffers)


class Adapter:
    """What compression_state needs of an adapter: its exchange, the object collectives, its place."""

    def __init__(self, megabytes: int):
        hvd.init()
        float64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        try:  # as hvdtrain.torch.adapter builds it
            self.collectives = Collectives(hvd, float64, self._name, torch.from_numpy)
        except TypeError:  # hvdtrain before issue 22 (the same job measures it)
            self.collectives = Collectives(hvd, float64, self._name)
        self._count = 0
        self.exchange = Exchange(megabytes, hvd.rank())

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}.{self._count}"

    def context(self) -> DistContext:
        return DistContext(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())

    def broadcast_object(self, obj, root_rank: int = 0):
        return self.collectives.broadcast_object(obj, root_rank)

    def allgather_object(self, obj):
        return self.collectives.allgather_object(obj)

    def gather_object_to_root(self, obj):
        return self.collectives.gather_object_to_root(obj)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux


def main() -> None:
    megabytes = int(sys.argv[1])
    adapter = Adapter(megabytes)
    adapter.broadcast_object(np.zeros(4))  # warm up the collectives before the baseline
    state = adapter.exchange.state()
    assert sum(a.nbytes for a in state.values()) >= megabytes * (1 << 20) - 16
    before = peak_mb()
    gathered = compression_state.gather(adapter)  # the checkpoint's gather
    extra = peak_mb() - before
    held = 0 if gathered is None else len(gathered)
    if hvd.rank() == 0:  # rank 0 must hold every rank's own state, in rank order
        assert held == hvd.size(), held
        for r, part in enumerate(gathered):
            assert float(part["error.0"][0]) == r and part["error.0"].nbytes == state["error.0"].nbytes
    print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "state_mb": megabytes,
                      "peak_extra_mb": round(extra, 1), "states_held": held}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
