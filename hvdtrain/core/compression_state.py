"""The per-rank state in the exact-resume checkpoint: the gradient exchange's, and each rank's own
running statistics at a step checkpoint.

Error-feedback buffers, and local SGD's replicas between averagings, differ from worker to worker,
so the checkpoint keeps every worker's copy: :func:`gather` collects them on rank 0 (a collective,
at the step every rank checkpoints), :func:`write` stores them as one ``comm_state.npz`` beside the
model (``<rank>/<key>``; the keys are listed in :mod:`hvdtrain.core.exchange`, the same in both
frameworks), and :func:`restore` hands each worker its own copy after the model broadcast.

So do the model's running statistics (BatchNorm means and variances), which each rank updates
from its own batches between evaluations: a step checkpoint's model holds their mean over the
ranks, while every rank trains on with its own (:func:`own_buffers`, kept under
``<rank>/model_buffer/<index>``), so writing a checkpoint changes nothing in the training and a
resume on the same number of workers continues exactly where the ranks were, in the statistics
too (a run stopped by a signal between two scheduled checkpoints included). On another number of
workers every rank starts from the checkpoint's mean.

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

import json
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.core.checkpoint import CheckpointError
from hvdtrain.core.compression import describe
from hvdtrain.core.errors import TrainingError
from hvdtrain.core.exchange import STATE_FORMAT
from hvdtrain.core.npz import open_npz

STATE_FILE = "comm_state.npz"
BUFFER_KEY = "model_buffer/"  # + index: a rank's own running statistics, in the adapter's order


def _stateful(adapter: Any) -> Any:
    """The adapter's exchange if it keeps per-rank state (the same answer on every rank), else None."""
    exchange = adapter.exchange
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


def own_buffers(adapter: Any) -> list[np.ndarray] | None:
    """This rank's own running statistics (what ``adapter.sync_model_buffers`` averages) as NumPy
    copies, in the adapter's fixed order; None for a model without any, with pipeline stages, or
    for an adapter that keeps none (the same answer on every rank)."""
    return adapter.model_buffers() or None


def gather(adapter: Any, buffers: list[np.ndarray] | None = None) -> list[dict[str, np.ndarray]] | None:
    """Every rank's exchange state and own running statistics ``buffers`` (:func:`own_buffers`
    before they were averaged; None: not kept), indexed by rank, on rank 0 (a collective when
    either is kept: :func:`gather_to_root`); None on the other ranks, and with no communication
    when there is nothing to keep."""
    exchange = _stateful(adapter)
    mine: dict[str, np.ndarray] = {}
    if exchange is not None:
        mine.update({**exchange.state(), "format": np.asarray(STATE_FORMAT)})
    mine.update({f"{BUFFER_KEY}{index:05d}": np.asarray(value) for index, value in enumerate(buffers or ())})
    if not mine:
        return None
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


def read(path: Path, size: int | None = None) -> list[dict[str, np.ndarray]] | None:
    """The per-rank states stored in checkpoint ``path`` (None if it holds none), written by
    ``size`` ranks (default: the world size its ``manifest.json`` records). A key that is not ``RANK/NAME`` with a rank below
    ``size`` (before: ``99999999999/model_buffer/00000`` built a list that long) is a
    CheckpointError naming the file, and so is a member whose header declares more than the file
    holds, a compressed or an object member (:func:`hvdtrain.core.npz.open_npz`: checked before any
    array is read, so reading takes no more memory than the file's size)."""
    file = Path(path) / STATE_FILE
    if not file.is_file():
        return None
    if size is None:
        try:
            size = int(json.loads((Path(path) / "manifest.json").read_text())["world_size"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{Path(path) / 'manifest.json'} does not give the world size ({exc})") from None
    states: dict[int, dict[str, np.ndarray]] = {}
    with open_npz(file) as saved:  # every member's header checked (size, dtype, no pickle) before any read
        for key in saved.files:
            rank, _, name = key.partition("/")
            if not (rank.isdigit() and len(rank) <= 9 and int(rank) < size and name):
                raise CheckpointError(f"{file}: key {key[:80]!r} is not RANK/NAME with a rank below the "
                                      f"checkpoint's world size {size}")
        for key in saved.files:
            rank, _, name = key.partition("/")
            states.setdefault(int(rank), {})[name] = saved[key]
    return [states.get(rank, {}) for rank in range(max(states) + 1)] if states else None


def _held(states: list[dict[str, np.ndarray]] | None, size: int) -> dict[str, bool]:
    """Whether ``states`` (what :func:`read` returned) hold every one of ``size`` ranks' exchange
    state and own running statistics."""
    complete = states is not None and len(states) == size

    def has(state: dict[str, np.ndarray], buffers: bool) -> bool:
        return any(k.startswith(BUFFER_KEY) == buffers for k in state)

    return {"exchange": complete and all(has(state, False) for state in states),
            "buffers": complete and all(has(state, True) for state in states)}


def _split(state: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """A rank's saved state as (exchange state, own running statistics in order)."""
    buffers = sorted(k for k in state if k.startswith(BUFFER_KEY))
    return {k: v for k, v in state.items() if not k.startswith(BUFFER_KEY)}, [state[k] for k in buffers]


def _set_buffers(adapter: Any, values: list[np.ndarray], checkpoint: str) -> None:
    """Give this rank its own running statistics back (checked against the model's)."""
    current = own_buffers(adapter) or []
    if [v.shape for v in values] != [v.shape for v in current]:
        raise TrainingError(f"checkpoint {checkpoint} holds {len(values)} running statistics per rank "
                           f"({[tuple(v.shape) for v in values][:4]}...), this model has {len(current)} "
                           f"({[tuple(v.shape) for v in current][:4]}...)")
    adapter.set_model_buffers(values)


def restore(adapter: Any, plan: dict[str, Any], rank: int, size: int, collective: bool = True) -> None:
    """Name the run's gradient exchange (rank 0) and give every rank its own saved exchange state
    and running statistics from the planned checkpoint (call after the model broadcast, on all ranks).

    A checkpoint from another world size, without the exchange state, or an elastic job (whose
    workers come and go) starts the exchange state afresh and says so on rank 0; the running
    statistics then stay the checkpoint model's (their mean over the ranks that wrote it)."""
    exchange = _stateful(adapter)
    if exchange is not None and rank == 0:
        print(f"hvdtrain: gradient exchange: {describe(exchange.plan)}", flush=True)
    keeps_buffers = own_buffers(adapter) is not None
    if not plan.get("checkpoint") or (exchange is None and not keeps_buffers):
        return
    if not collective:
        reset(adapter, "elastic job")
        return
    saved_size = int(plan["manifest"].get("world_size", size))
    verdict = None
    if rank == 0:
        try:
            states = read(Path(plan["checkpoint"]), saved_size) if saved_size == size else None
            verdict = _held(states, size)
        except CheckpointError as exc:  # every rank hears of it (no rank waits for a scatter)
            states, verdict = None, {"error": str(exc)}
    else:
        states = None
    held = adapter.broadcast_object(verdict)  # distributed: rank 0's verdict
    if "error" in held:
        raise CheckpointError(held["error"])
    if exchange is not None and not held["exchange"]:
        why = (f"the checkpoint was written by {saved_size} workers, this job has {size}" if saved_size != size
               else "the checkpoint holds no gradient-compression / local-SGD state")
        reset(adapter, why)
    load_exchange, load_buffers = exchange is not None and held["exchange"], keeps_buffers and held["buffers"]
    if not (load_exchange or load_buffers):
        return
    mine = scatter_from_root(adapter, states)  # distributed: each rank gets its own state only
    del states
    exchange_state, buffers = _split(mine)
    if load_exchange:
        exchange.load_state(exchange_state)
    if load_buffers:
        _set_buffers(adapter, buffers, plan["checkpoint"])
