"""The job-wide collectives the loop needs, written once on a framework's Horovod module.

``horovod.torch`` and ``horovod.tensorflow`` offer the same object collectives and the same
``allreduce``; only the tensor type differs. :class:`Collectives` holds the module, a function
that makes a float64 tensor of that framework, and the naming rule for collectives, so both
adapters share this code instead of each writing it (they build one in ``init``). Nothing here
imports torch or TensorFlow.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


class Collectives:
    """Sums, object broadcast and object gather over every rank, on ``hvd`` (a framework's
    Horovod module, initialised). ``float64_tensor(values)`` makes that framework's tensor of a
    list of floats; ``name(prefix)`` names each collective (the same on every rank, call by call)."""

    def __init__(self, hvd: Any, float64_tensor: Callable[[list[float]], Any], name: Callable[[str], str]):
        self.hvd = hvd
        self.float64_tensor = float64_tensor
        self.name = name

    def allreduce_sums(self, values: dict[str, float]) -> dict[str, float]:
        """Sum each value across ranks (one collective; the same keys on every rank)."""
        keys = list(values)
        tensor = self.float64_tensor([float(values[k]) for k in keys])
        reduced = self.hvd.allreduce(tensor, op=self.hvd.Sum, name=self.name("allreduce_sums"))  # distributed
        return dict(zip(keys, np.asarray(reduced, dtype=np.float64).tolist()))

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        """A picklable object from ``root_rank``, on every rank."""
        return self.hvd.broadcast_object(obj, root_rank=root_rank, name=self.name("broadcast_object"))  # distributed

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, as a list indexed by rank, on every rank."""
        return self.hvd.allgather_object(obj, name=self.name("allgather_object"))  # distributed
