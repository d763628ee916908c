"""Carrying out the agreed start on every rank: the checkpoint restored and broadcast, the random
streams, the gradient exchange's state.

Rank 0 plans where a run starts and every rank gets the same plan (:mod:`hvdtrain.core.resume`);
:func:`start` then runs on every rank once the model exists. A rank that does not get its own
random state back (a fresh start, or a resume on another number of workers) is reseeded from
(seed, rank, position) by :func:`reseed`: dropout masks differ between ranks, as their data do,
and the run is reproducible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.core import compression_state, resume
from hvdtrain.core.resume import Position
from hvdtrain.core.results import TrainingState


def reseed(adapter: Any, seed: int, rank: int, position: Position) -> None:
    """Give this rank its own framework random stream, drawn from (``seed``, ``rank``, ``position``)."""
    value = np.random.SeedSequence([seed, rank, position.epoch, position.consumed]).generate_state(1)[0]
    adapter.reseed(int(value))


def start(plan: dict[str, Any], adapter: Any, ctx: Any, gate: Any, output: Path, watchdog: Any, seed: int,
          collective: bool = True) -> TrainingState:
    """Carry out the agreed ``plan`` on every rank (its notes on rank 0): restore the checkpoint,
    and, when ``collective`` (not in an elastic sync, which broadcasts and reseeds itself),
    broadcast rank 0's model and reseed a rank without its own random state."""
    for note in plan.get("notes", []):
        gate.warn(note)
    watchdog.beat(0, "restoring the checkpoint")
    position, history, carried = resume.restore(plan, adapter, ctx, gate, output, collective)
    if collective:
        adapter.broadcast_state(root_rank=0)
        if carried is None:  # a fresh start, or a resume on another number of workers
            reseed(adapter, seed, ctx.rank, position)
    compression_state.restore(adapter, plan, ctx.rank, ctx.size, collective)  # exchange state
    return TrainingState(position, history, carried, Path(plan["checkpoint"]) if plan.get("checkpoint") else None)
