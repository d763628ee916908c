"""Where a run starts: rank 0's resume plan, and the planned checkpoint restored on every rank.

:func:`plan_start` runs on rank 0 before anything is built. It checks the output directory, asks
:meth:`~hvdtrain.core.checkpoint.CheckpointManager.latest` for the newest verified checkpoint,
refuses one saved with another state-defining setting (:data:`STATE_DEFINING_KEYS`: nothing is
changed then) and only after that moves newer damaged checkpoints aside. The plan is a plain dict,
broadcast to every rank so that all ranks start at the same point or all stop with the same error:
``{"error": message}`` or ``{"checkpoint": path or None, "manifest": ..., "notes": [...]}``.

:func:`restore` carries the plan out once the model exists: rank 0 loads the weights (the loop
broadcasts them), cuts ``metrics.jsonl`` back to the checkpoint, and with the same world size
every rank gets back its own random-number state (:func:`capture_rng` / :func:`restore_rng`) and
partial-epoch totals, so the run continues bitwise as if never stopped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.core.checkpoint import CheckpointInfo, CheckpointManager, atomic_write_text
from hvdtrain.core.config import RunConfig, to_dict
from hvdtrain.core.errors import TrainingError

METRICS_FILE = "metrics.jsonl"
RANK_STATE_FILE = "rank_state.json"
# Config keys that decide the shape of the saved state or the meaning of its position (the epoch's
# batches, the accumulation windows): resuming across a change is refused.
STATE_DEFINING_KEYS = ("model", "optim.name", "train.batch_size", "train.grad_accumulation")


@dataclass
class Position:
    """Where training stands: completed epochs, positions of the current epoch's order already
    consumed, optimizer steps taken."""

    epoch: int = 0
    consumed: int = 0
    step: int = 0


def check_output_dir(output: Path) -> None:
    """Create ``output`` if needed and prove it is a writable directory (OSError -> a clear message)."""
    if output.exists() and not output.is_dir():
        raise TrainingError(f"output {output} exists and is not a directory")
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / ".hvdtrain-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise TrainingError(f"output directory {output} is not writable: {exc}") from None


def _get(config: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        config = config.get(part, {}) if isinstance(config, dict) else {}
    return config


def incompatibility(info: CheckpointInfo, config: RunConfig) -> str | None:
    """Why checkpoint ``info`` cannot be resumed by this config (another recipe, framework or
    state-defining key), or None if it can."""
    for key in ("recipe", "framework"):
        if info.manifest.get(key) != getattr(config, key):
            return (f"cannot resume: checkpoint {info.path} is from {key} {info.manifest.get(key)!r}, this run "
                    f"uses {getattr(config, key)!r} (nothing was changed)")
    saved, now = info.manifest.get("config", {}), to_dict(config)
    for key in STATE_DEFINING_KEYS:
        if _get(saved, key) != _get(now, key):
            return (f"cannot resume: checkpoint {info.path} was saved with {key}={_get(saved, key)!r}, this run "
                    f"has {key}={_get(now, key)!r}; use the same {key} or another --output (nothing was changed)")
    return None


def plan_start(config: RunConfig, manager: CheckpointManager, output: Path) -> dict[str, Any]:
    """Rank 0's decision: where to start, or the error every rank should raise (never raises)."""
    try:
        check_output_dir(output)
        manager.remove_temporaries()
        if not config.checkpoint.resume:
            existing = manager.checkpoints()
            if existing:
                return {"error": f"output directory {output} already holds checkpoints "
                                 f"({existing[-1].path.name}); pass --resume to continue that run or choose "
                                 f"another --output (nothing was changed)"}
            return {"checkpoint": None}
        notes: list[str] = []
        damaged: list[CheckpointInfo] = []
        latest = manager.latest(notes, damaged)
        problem = incompatibility(latest, config) if latest is not None else None
        if problem:
            return {"error": problem}
        notes += manager.set_aside(damaged)  # out of the way of the checkpoints this run will write, but kept
        if latest is None:
            notes.append(f"--resume: no usable checkpoint in {manager.directory}; starting from scratch")
            abandoned = set_metrics_aside(output)
            if abandoned:
                notes.append(f"the abandoned run's {METRICS_FILE} was moved to {abandoned.name}")
            return {"checkpoint": None, "notes": notes}
        if damaged:
            notes.append(f"falling back to checkpoint {latest.path}")
        return {"checkpoint": str(latest.path), "manifest": latest.manifest, "notes": notes}
    except Exception as exc:  # every rank must hear about it, or the others hang in the broadcast
        return {"error": str(exc)}


def set_metrics_aside(output: Path) -> Path | None:
    """Move a run's ``metrics.jsonl`` out of the way of a run that starts from scratch (kept, under
    a name no other run uses); returns where it went, or None when there was none."""
    path = output / METRICS_FILE
    if not path.is_file():
        return None
    n = 1
    while (output / f"{METRICS_FILE}.abandoned-{n}").exists():
        n += 1
    return path.rename(output / f"{METRICS_FILE}.abandoned-{n}")


def previous_history(output: Path, upto_epoch: int) -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` rows of epochs up to ``upto_epoch`` (what the checkpoint had seen)."""
    path = output / METRICS_FILE
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("epoch", 0) <= upto_epoch]


def capture_rng() -> dict[str, Any]:
    """This process's Python and NumPy global random states, as JSON-ready lists."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def restore_rng(state: dict[str, Any]) -> None:
    """Set the Python and NumPy global random states :func:`capture_rng` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def restore(plan: dict[str, Any], adapter: Any, ctx: Any, gate: Any, output: Path,
            collective: bool = True) -> tuple[Position, list[dict[str, Any]], dict[str, Any] | None]:
    """Load the planned checkpoint (rank 0), hand every rank its RNG state and partial-epoch totals
    (one broadcast when ``collective``), and return the position, the metrics history and this
    rank's carried totals (None: a fresh start, or another world size: the caller reseeds)."""
    if not plan.get("checkpoint"):
        return Position(), [], None
    manifest, path = plan["manifest"], Path(plan["checkpoint"])
    position = Position(int(manifest["epoch"]), int(manifest.get("consumed", 0)), int(manifest["step"]))
    history: list[dict[str, Any]] = []
    rank_states = None
    if ctx.is_main:
        adapter.load_state(path)
        history = previous_history(output, position.epoch)
        atomic_write_text(output / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in history))
        if (path / RANK_STATE_FILE).is_file():
            rank_states = json.loads((path / RANK_STATE_FILE).read_text())
    rank_states = adapter.broadcast_object(rank_states) if collective else None  # distributed
    saved_size = int(manifest.get("world_size", ctx.size))
    where = (f"epoch {position.epoch + 1}, after {position.consumed} samples"
             if position.consumed else f"epoch {position.epoch + 1}")
    if saved_size == ctx.size and rank_states:
        mine = rank_states[ctx.rank]
        restore_rng(mine["rng"])
        adapter.set_rng_state(mine["rng"]["framework"])
        gate.print(f"hvdtrain: resuming from {path} at {where}")
        return position, history, mine
    # The step counter keeps counting the updates taken; the LR follows the position (schedule_step).
    gate.print(f"hvdtrain: resuming from {path} at {where} (saved with {saved_size} workers, now "
               f"{ctx.size}: the rest of the epoch is resharded, the LR rescaled and random streams reseeded)")
    return position, history, None
