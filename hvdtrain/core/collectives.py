"""The job-wide collectives the loop needs, written once on a framework's Horovod module.

``horovod.torch`` and ``horovod.tensorflow`` offer the same object collectives and the same
``allreduce``; only the tensor type differs. :class:`Collectives` holds the module, a function
that makes a float64 tensor of that framework, and the naming rule for collectives, so both
adapters share this code instead of each writing it (they build one in ``init``). Nothing here
imports torch or TensorFlow.

Horovod's object collectives give every rank every object, and encode each one through a Python
``bytearray`` (about ten times the object's size at the sender). The checkpoint's per-rank state
(error-feedback buffers, local-SGD replicas) needs only to reach rank 0, and back to its own rank
on a resume: :meth:`Collectives.gather_object_to_root` and :meth:`Collectives.scatter_objects_from_root`
move pickled bytes as uint8 tensors with ``alltoall`` splits that name one receiver, so a rank
other than 0 never holds more than its own object (and its pickled bytes).
"""

from __future__ import annotations

import io
import math
import pickle
from typing import Any, Callable

import numpy as np

CHUNK_BYTES = 1 << 30  # one alltoall moves at most this much per rank (Horovod's splits are int32)


def _pickled(obj: Any) -> memoryview:
    """``obj`` pickled into a writable buffer (no copy: a tensor can be made on it)."""
    buffer = io.BytesIO()
    pickle.dump(obj, buffer, protocol=5)
    return buffer.getbuffer()


def broadcast_pickled(hvd: Any, from_numpy: Callable[[np.ndarray], Any], obj: Any, root_rank: int, name: str,
                      process_set: Any = None) -> Any:
    """``obj`` from ``root_rank`` (a global rank) on every rank of ``process_set`` (None: every
    rank), pickled once into a uint8 tensor made on the pickle's own buffer: two broadcasts, its
    length and its bytes. Horovod's ``broadcast_object`` builds its tensor from a Python
    ``bytearray`` element by element, seconds per ten megabytes (a pipeline checkpoint of the
    2-million-parameter small CNN spent 7-13 s there on 4 ranks)."""
    where = {} if process_set is None else {"process_set": process_set}
    mine = hvd.rank() == root_rank
    data = _pickled(obj) if mine else None
    length = hvd.broadcast(from_numpy(np.array([len(data) if mine else 0], dtype=np.int64)), root_rank,
                           name=f"{name}.length", **where)  # distributed
    payload = np.frombuffer(data, dtype=np.uint8) if mine else np.zeros(int(np.asarray(length)[0]), np.uint8)
    received = hvd.broadcast(from_numpy(payload), root_rank, name=f"{name}.bytes", **where)  # distributed
    return obj if mine else pickle.loads(np.asarray(received))


class Collectives:
    """Sums, object broadcast and object gather over every rank, on ``hvd`` (a framework's
    Horovod module, initialised). ``float64_tensor(values)`` makes that framework's tensor of a
    list of floats; ``name(prefix)`` names each collective (the same on every rank, call by call)."""

    def __init__(self, hvd: Any, float64_tensor: Callable[[list[float]], Any], name: Callable[[str], str],
                 from_numpy: Callable[[np.ndarray], Any] | None = None):
        self.hvd = hvd
        self.float64_tensor = float64_tensor
        self.name = name
        self.from_numpy = from_numpy  # a NumPy array as this framework's (CPU) tensor; None: objects only

    def allreduce_sums(self, values: dict[str, float]) -> dict[str, float]:
        """Sum each value across ranks (one collective; the same keys on every rank)."""
        keys = list(values)
        tensor = self.float64_tensor([float(values[k]) for k in keys])
        reduced = self.hvd.allreduce(tensor, op=self.hvd.Sum, name=self.name("allreduce_sums"))  # distributed
        return dict(zip(keys, np.asarray(reduced, dtype=np.float64).tolist()))

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        """A picklable object from ``root_rank``, on every rank (:func:`broadcast_pickled` when this
        framework's tensors can be made from NumPy, else Horovod's ``broadcast_object``)."""
        if self.from_numpy is not None:
            return broadcast_pickled(self.hvd, self.from_numpy, obj, root_rank, self.name("broadcast_object"))
        return self.hvd.broadcast_object(obj, root_rank=root_rank, name=self.name("broadcast_object"))  # distributed

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, as a list indexed by rank, on every rank."""
        return self.hvd.allgather_object(obj, name=self.name("allgather_object"))  # distributed

    # -- rank 0 and one rank at a time: memory on rank 0 only -----------------------------------------

    def _sizes(self, mine: list[int]) -> list[int]:
        """``mine`` (one count per rank, 0 where this rank has nothing to say) summed over ranks:
        every rank's counts on every rank (one float64 allreduce of ``size`` numbers)."""
        sums = self.allreduce_sums({str(r): float(n) for r, n in enumerate(mine)})
        return [int(round(sums[str(r)])) for r in range(len(mine))]

    def _exchange(self, chunks: list[bytes | memoryview]) -> list[np.ndarray]:
        """One alltoall: ``chunks[r]`` (possibly empty) to rank ``r``; returns what each rank sent here."""
        size = self.hvd.size()
        views = [np.frombuffer(c, dtype=np.uint8) for c in chunks if len(c)]
        # one receiver (a gather's sender): its bytes as they are, no copy; several: one copy
        payload = views[0] if len(views) == 1 else np.concatenate(views) if views else np.zeros(0, np.uint8)
        output, received = self.hvd.alltoall(self.from_numpy(payload), splits=[len(c) for c in chunks],
                                             name=self.name("alltoall_bytes"))  # distributed
        data, counts = np.asarray(output), np.asarray(received).tolist()
        bounds = np.cumsum([0, *counts])
        return [data[bounds[r]:bounds[r + 1]] for r in range(size)]

    def gather_object_to_root(self, obj: Any) -> list[Any] | None:
        """Every rank's picklable ``obj``, as a list indexed by rank, on rank 0; None elsewhere. Only
        rank 0 receives: other ranks hold their own object and its bytes, never another rank's."""
        rank, size = self.hvd.rank(), self.hvd.size()
        if size == 1:
            return [obj]
        if self.from_numpy is None:  # one broadcast per rank, kept by rank 0 only
            gathered = [obj] if rank == 0 else None
            for root in range(1, size):
                got = self.broadcast_object(obj if rank == root else None, root)  # distributed
                if gathered is not None:
                    gathered.append(got)
                del got
            return gathered
        data = _pickled(obj) if rank != 0 else memoryview(bytearray())
        sizes = self._sizes([len(data) if r == rank else 0 for r in range(size)])  # distributed
        parts: list[list[np.ndarray]] | None = [[] for _ in range(size)] if rank == 0 else None
        for k in range(max(1, math.ceil(max(sizes) / CHUNK_BYTES))):
            chunk = data[k * CHUNK_BYTES:(k + 1) * CHUNK_BYTES]
            nothing = memoryview(bytearray())
            received = self._exchange([chunk if r == 0 else nothing for r in range(size)])  # distributed
            if parts is not None:
                for r in range(1, size):
                    parts[r].append(received[r])
            del received
        del data
        if parts is None:
            return None
        return [obj] + [pickle.loads(np.concatenate(parts[r]) if len(parts[r]) > 1 else parts[r][0])
                        for r in range(1, size)]

    def scatter_objects_from_root(self, items: list[Any] | None) -> Any:
        """Rank 0's ``items[r]`` (picklable) on each rank ``r``; ``items`` is read on rank 0 only.
        Each rank receives its own item and nothing else."""
        rank, size = self.hvd.rank(), self.hvd.size()
        if size == 1:
            return items[0]
        if self.from_numpy is None:  # one broadcast per rank, kept by that rank only
            mine = items[0] if rank == 0 else None
            for target in range(1, size):
                got = self.broadcast_object(items[target] if rank == 0 else None, 0)  # distributed
                if rank == target:
                    mine = got
                del got
            return mine
        blobs = [memoryview(bytearray())] + [_pickled(items[r]) for r in range(1, size)] if rank == 0 else None
        sizes = self._sizes([len(b) for b in blobs] if blobs is not None else [0] * size)  # distributed
        parts: list[np.ndarray] = []
        for k in range(max(1, math.ceil(max(sizes) / CHUNK_BYTES))):
            chunks = ([b[k * CHUNK_BYTES:(k + 1) * CHUNK_BYTES] for b in blobs] if blobs is not None
                      else [memoryview(bytearray())] * size)
            parts.append(self._exchange(list(chunks))[0])  # distributed: from rank 0
        del blobs
        if rank == 0:
            return items[0]
        return pickle.loads(np.concatenate(parts) if len(parts) > 1 else parts[0])
