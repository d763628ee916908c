"""The gradient exchange's per-rank state in the exact-resume checkpoint.

Error-feedback buffers, and local SGD's replicas between averagings, differ from worker to worker,
so the checkpoint keeps every worker's copy: :func:`gather` collects them (a collective, at the
step every rank checkpoints), :func:`write` stores them as one ``comm_state.npz`` beside the model
(``<rank>/<key>``; the keys are listed in :mod:`hvdtrain.core.exchange`, the same in both
frameworks), and :func:`restore` hands each worker its own copy after the model broadcast. A
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


def gather(adapter: Any) -> list[dict[str, np.ndarray]] | None:
    """Every rank's exchange state, indexed by rank (a collective on runs that have such state;
    None, with no communication, on the others)."""
    exchange = _stateful(adapter)
    if exchange is None:
        return None
    mine = {**exchange.state(), "format": np.asarray(STATE_FORMAT)}
    return adapter.allgather_object(mine)  # distributed


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
    states = adapter.broadcast_object(states)  # distributed
    if saved_size != size or states is None or len(states) != size:
        why = (f"the checkpoint was written by {saved_size} workers, this job has {size}" if saved_size != size
               else "the checkpoint holds no gradient-compression / local-SGD state")
        reset(adapter, why)
        return
    exchange.load_state(states[rank])
