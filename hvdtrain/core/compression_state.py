"""The gradient exchange's per-rank state in the exact-resume checkpoint.

Error-feedback buffers, and local SGD's replicas between averagings, differ from worker to worker,
so the checkpoint keeps every worker's copy: :func:`gather` collects them on rank 0 (a collective,
at the step every rank checkpoints), :func:`write` stores them as one ``comm_state.npz`` beside the
model (``<rank>/<key>``; the keys are listed in :mod:`hvdtrain.core.exchange`, the same in both
frameworks), and :func:`restore` hands each worker its own copy after the model broadcast.

Only rank 0 ever holds every worker's state: :func:`gather_to_root` sends each worker's pickled
state to rank 0 only (``alltoall`` with one receiver,
:meth:`~hvdtrain.core.collectives.Collectives.gather_object_to_root`; Horovod has no gather to one
rank for objects), and :func:`restore` sends each worker its own state
back the same way. A worker other than 0 holds its own state and its bytes, whatever the number of
workers (the all-gather before gave every worker all of them: ResNet-50's error buffers on 32 ranks
are about 3 GB per rank). A
checkpoint from a different world size, or one without the file, starts the state afresh
(:func:`reset`) and the run says so. The adapter's exchange is ``adapter.exchange``
(:class:`~hvdtrain.core.exchange.GradientExchange`); an exchange that keeps no state (Horovod's
allreduce) writes no file and costs no collective.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.core.compression import describe
from hvdtrain.core.exchange import STATE_FORMAT

STATE_FILE = "comm_state.npz"


def _stateful(adapter: Any) -> Any:
    """The adapter's exchange if it keeps per-rank state (the same answer on every rank), else None."""
    exchange = getattr(adapter, "exchange", None)
    return exchange if exchange is not None and exchange.keeps_state else None


def gather_to_root(adapter: Any, mine: Any) -> list[Any] | None:
    """Every rank's picklable ``mine``, indexed by rank, on rank 0; None on the other ranks (a
    collective: ``adapter.gather_object_to_root``, in which only rank 0 receives)."""
    if adapter.context().size == 1:
        return [mine]
    return adapter.gather_object_to_root(mine)  # distributed


def scatter_from_root(adapter: Any, items: list[Any] | None) -> Any:
    """Rank 0's ``items[r]`` on each rank ``r`` (a collective; ``items`` is read on rank 0 only;
    each rank receives its own item only)."""
    if adapter.context().size == 1:
        return items[0]
    return adapter.scatter_objects_from_root(items)  # distributed


def gather(adapter: Any) -> list[dict[str, np.ndarray]] | None:
    """Every rank's exchange state, indexed by rank, on rank 0 (a collective on runs that have such
    state: :func:`gather_to_root`); None on the other ranks, and with no communication on runs
    without such state."""
    exchange = _stateful(adapter)
    if exchange is None:
        return None
    mine = {**exchange.state(), "format": np.asarray(STATE_FORMAT)}
    return gather_to_root(adapter, mine)  # distributed


def reset(adapter: Any, reason: str) -> None:
    """Start the exchange state afresh (another world size, an elastic re-formation), saying so on
    rank 0; nothing happens for an exchange without state."""
    exchange = _stateful(adapter)
    if exchange is None:
        return
    exchange.reset()
    if adapter.context().is_main:
        print(f"hvdtrain: {reason}: gradient-compression / local-SGD state starts afresh", flush=True)


def write(directory: Path, states: list[dict[str, np.ndarray]] | None) -> None:
    """Store what :func:`gather` returned (rank 0, inside the checkpoint's atomic write)."""
    if states is None:
        return
    arrays = {f"{rank}/{name}": np.asarray(value) for rank, state in enumerate(states) for name, value in state.items()}
    with open(Path(directory) / STATE_FILE, "wb") as f:
        np.savez(f, **arrays)


def read(path: Path) -> list[dict[str, np.ndarray]] | None:
    """The per-rank states stored in checkpoint ``path`` (None if it holds none)."""
    file = Path(path) / STATE_FILE
    if not file.is_file():
        return None
    states: dict[int, dict[str, np.ndarray]] = {}
    with np.load(file, allow_pickle=False) as saved:
        for key in saved.files:
            rank, name = key.split("/", 1)
            states.setdefault(int(rank), {})[name] = saved[key]
    return [states.get(rank, {}) for rank in range(max(states) + 1)] if states else None


def restore(adapter: Any, plan: dict[str, Any], rank: int, size: int, collective: bool = True) -> None:
    """Name the run's gradient exchange (rank 0) and give every rank its own saved exchange state
    from the planned checkpoint (call after the model broadcast, on all ranks).

    A checkpoint from another world size, without the state, or an elastic job (whose workers come
    and go) starts the state afresh and says so on rank 0."""
    exchange = _stateful(adapter)
    if exchange is None:
        return
    if rank == 0:
        print(f"hvdtrain: gradient exchange: {describe(exchange.plan)}", flush=True)
    if not plan.get("checkpoint"):
        return
    saved_size = int(plan["manifest"].get("world_size", size))
    if not collective:
        reset(adapter, "elastic job")
        return
    states = read(Path(plan["checkpoint"])) if rank == 0 else None
    complete = states is not None and len(states) == size
    complete = adapter.broadcast_object(complete)  # distributed: rank 0's verdict, on every rank
    if saved_size != size or not complete:
        why = (f"the checkpoint was written by {saved_size} workers, this job has {size}" if saved_size != size
               else "the checkpoint holds no gradient-compression / local-SGD state")
        reset(adapter, why)
        return
    mine = scatter_from_root(adapter, states)  # distributed: each rank gets its own state only
    del states
    exchange.load_state(mine)
