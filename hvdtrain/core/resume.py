"""Where a run starts: rank 0's resume plan, and the planned checkpoint restored on every rank.

:func:`plan_start` runs on rank 0. It takes the output's lock
(:class:`~hvdtrain.core.outputdir.OutputLock`: one run at a time), refuses a directory an earlier
run used unless this run resumes, asks
:meth:`~hvdtrain.core.checkpoint.CheckpointManager.latest` for the newest verified checkpoint,
refuses one saved with another state-defining setting (a config field declared with
``resume=``: :func:`hvdtrain.core.config.resume_keys`; nothing is
changed then), reads the metrics history up to it (a torn last line is dropped with a warning)
and only after that moves newer damaged checkpoints aside. The plan is a plain dict, the decision
:func:`agree` broadcasts to every rank so that all ranks start at the same point or all stop with
the same error: ``{"error": message}`` or ``{"checkpoint": path or None, "manifest": ...,
"history": [...], "notes": [...]}``. In elastic mode the decision is taken in the elastic state's
first sync by whichever worker is rank 0 then (:mod:`hvdtrain.core.elastic`).

:func:`restore` carries the plan out once the model exists: rank 0 loads the weights (the loop
broadcasts them), cuts ``metrics.jsonl`` back to the checkpoint, and with the same world size
every rank gets back its own random-number state (:func:`capture_rng` / :func:`restore_rng`) and
partial-epoch totals, so the run continues bitwise as if never stopped.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.core import early_stop
from hvdtrain.core.checkpoint import CheckpointError, CheckpointInfo, CheckpointManager
from hvdtrain.core.durable import atomic_write_text
from hvdtrain.core.config import RunConfig, resume_keys, to_dict
from hvdtrain.core.errors import TrainingError
from hvdtrain.core.outputdir import CONFIG_FILE, OutputLock, describe, run_files
from hvdtrain.core.redact import redact_values

METRICS_FILE = "metrics.jsonl"
RANK_STATE_FILE = "rank_state.json"
# Config keys that decide the shape of the saved state or the meaning of its position (the epoch's
# batches, the accumulation windows, which samples the epoch's order holds and in which order):
# resuming across a change is refused.
_MISSING = object()


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
        config = config.get(part, _MISSING) if isinstance(config, dict) else _MISSING
    return config


def _comparable(key: str, value: Any) -> Any:
    """``value`` as resume compares it: a path (``data.path``, ``text.val_path``) spelled another way
    (``imgs/``, ``./imgs``) is the same."""
    if key.endswith("path") and isinstance(value, str):
        return os.path.normpath(os.path.expanduser(value))
    return value


def incompatibility(info: CheckpointInfo, config: RunConfig, elsewhere: str = "another --output") -> str | None:
    """Why checkpoint ``info`` cannot be resumed by this config (another recipe, framework or
    state-defining key), or None if it can; ``elsewhere`` is the advice's other place to write to
    (a script's own loop has no ``--output``)."""
    for key in ("recipe", "framework"):
        if info.manifest.get(key) != getattr(config, key):
            return (f"cannot resume: checkpoint {info.path} is from {key} {info.manifest.get(key)!r}, this run "
                    f"uses {getattr(config, key)!r} (nothing was changed)")
    return config_difference(info.manifest.get("config", {}), config, "cannot resume:",
                             f"checkpoint {info.path} was saved with", elsewhere)


def config_difference(saved: dict[str, Any], config: RunConfig, lead: str, source: str,
                      elsewhere: str = "another --output") -> str | None:
    """The first state-defining key (:func:`~hvdtrain.core.config.resume_keys`) whose value in the
    ``saved`` config differs from ``config``'s, as ``"{lead} {source} KEY=...; this run has ..."``."""
    now = to_dict(config)
    for key, kind in resume_keys(config):
        before, after = _get(saved, key), _get(now, key)
        if before is _MISSING or _comparable(key, redact_values(before)) == _comparable(key, redact_values(after)):
            continue  # a checkpoint from a version without that key has nothing to compare
        why = " (its position in the data would skip or repeat samples)" if kind == "data" else ""
        return (f"{lead} {source} {key}={before!r}, this run "
                f"has {key}={after!r}{why}; use the same {key} or {elsewhere} (nothing was changed)")
    return None


def plan_start(config: RunConfig, manager: CheckpointManager, output: Path, lock: OutputLock) -> dict[str, Any]:
    """Rank 0's decision: where to start, or the error every rank should raise (never raises).
    Takes ``lock`` first and keeps it unless the decision is an error."""
    try:
        check_output_dir(output)
        busy = lock.acquire()
        if busy:
            return {"error": busy}
        plan = _plan(config, manager, output)
        if lock.warning and not plan.get("error"):
            plan["notes"] = [lock.warning, *plan.get("notes", [])]
    except Exception as exc:  # every rank must hear about it, or the others hang in the broadcast
        plan = {"error": str(exc)}
    if plan.get("error"):
        lock.release(remove=lock.created)  # a refused run leaves the directory as it found it
    return plan


def other_run(output: Path, config: RunConfig) -> str | None:
    """With ``checkpoint.resume=auto``: why ``output``'s run is not this one (another recipe,
    framework or state-defining key in its ``config.yaml``, or no ``config.yaml`` at all), or None."""
    import yaml

    path = output / CONFIG_FILE
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        saved = None
    if not isinstance(saved, dict):
        return (f"output directory {output} already holds a run ({describe(run_files(output))}) with no readable "
                f"{CONFIG_FILE} to tell whether it is this run")
    for key in ("recipe", "framework"):
        if saved.get(key) != getattr(config, key):
            return f"output directory {output} holds a {key} {saved.get(key)!r} run, this run is {getattr(config, key)!r}"
    return config_difference(saved, config, f"output directory {output} holds another run:", f"{path} has")


def _plan(config: RunConfig, manager: CheckpointManager, output: Path) -> dict[str, Any]:
    if config.checkpoint.resume == "auto":
        if not run_files(output):
            manager.remove_temporaries()
            return {"checkpoint": None, "fresh": True}
        problem = other_run(output, config)
        if problem:
            return {"error": f"checkpoint.resume=auto: {problem}; continue it with --resume (the usual checks) or "
                             f"choose another --output (nothing was changed)"}
    elif not config.checkpoint.resume:
        used = run_files(output)
        if used:
            return {"error": f"output directory {output} already holds a run ({describe(used)}); pass --resume to "
                             f"continue that run or choose another --output (nothing was changed)"}
        manager.remove_temporaries()
        return {"checkpoint": None, "fresh": True}  # a failure before the first epoch undoes its files
    notes: list[str] = []
    damaged: list[CheckpointInfo] = []
    latest = manager.latest(notes, damaged)
    problem = incompatibility(latest, config) if latest is not None else None
    if problem:
        return {"error": problem}
    history = read_history(output, latest, notes) if latest is not None else []
    stop = early_stop.resume_refusal(config, latest.manifest.get("config", {}), history) if latest else None
    if stop:
        return {"error": stop}  # a run that stopped early is not trained past its stop by more epochs
    manager.remove_temporaries()  # no other run writes here: this one holds the lock
    notes += manager.set_aside(damaged)  # out of the way of the checkpoints this run will write, but kept
    if latest is None:
        notes.append(f"--resume: no usable checkpoint in {manager.directory}; starting from scratch")
        abandoned = set_metrics_aside(output)
        if abandoned:
            notes.append(f"the abandoned run's {METRICS_FILE} was moved to {abandoned.name}")
        return {"checkpoint": None, "notes": notes}
    if damaged:
        notes.append(f"falling back to checkpoint {latest.path}")
    return {"checkpoint": str(latest.path), "manifest": latest.manifest, "history": history, "notes": notes}


def agree(adapter: Any, is_main: bool, propose: Any, root_rank: int = 0) -> dict[str, Any]:
    """The start every rank takes: ``propose()`` on the root (rank 0) broadcast to all (a collective);
    an error in it raises the same :class:`TrainingError` on every rank, so the whole job stops."""
    decision = adapter.broadcast_object(propose() if is_main else None, root_rank=root_rank)  # distributed
    if decision.get("error"):
        raise TrainingError(decision["error"])
    return decision


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


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of a ``metrics.jsonl`` and a warning when its last line was torn (a kill or a full
    disk during the append: it is dropped); a damaged line before the last is a TrainingError
    naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        return [], None
    lines = [(n, line) for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if line.strip()]
    rows: list[dict[str, Any]] = []
    for k, (n, line) in enumerate(lines):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if k == len(lines) - 1:
                return rows, (f"{path}: dropped its torn last line {n} ({line[:60]!r}...: {exc}), the end of "
                              f"an append that did not finish")
            raise TrainingError(f"{path}: line {n} is not a JSON object ({line[:60]!r}: {exc}); fix or delete "
                                f"that line (nothing was changed)") from None
        rows.append(row)
    return rows, None


def read_history(output: Path, checkpoint: CheckpointInfo, notes: list[str]) -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` rows of the epochs up to ``checkpoint`` (what it had seen), and the row of
    the epoch it cut short (``train.max_steps``: an evaluated checkpoint inside an epoch); the
    checkpoint's own epoch row comes from its manifest when the file lost it (torn, or the run was
    killed between the checkpoint and the append). Warnings go to ``notes``."""
    rows, torn = read_metrics(Path(output) / METRICS_FILE)
    if torn:
        notes.append(torn)
    epoch = int(checkpoint.manifest["epoch"])
    record = checkpoint.manifest.get("metrics")
    cut = record.get("step") if isinstance(record, dict) and checkpoint.consumed else None  # train.max_steps
    history = [r for r in rows if r.get("epoch", 0) <= epoch or (r.get("epoch") == epoch + 1 and r.get("step") == cut)]
    if epoch and isinstance(record, dict) and record.get("epoch") == epoch and \
            not any(r.get("epoch") == epoch for r in history):
        history.append(record)
        notes.append(f"{METRICS_FILE} had no row for epoch {epoch}; taken from checkpoint {checkpoint.path}")
    return history


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


def read_rank_states(path: Path, size: int) -> list[dict[str, Any]] | None:
    """The per-rank states (RNG, partial-epoch totals) of checkpoint ``path``, written by ``size``
    ranks: None if it has no ``rank_state.json``; a file that is not one entry per rank with
    random states Python and NumPy accept is a CheckpointError naming it (before: "state vector is
    the wrong size" on every rank, naming no file)."""
    file = path / RANK_STATE_FILE
    if not file.is_file():
        return None
    try:
        states = json.loads(file.read_text())
        if not isinstance(states, list) or len(states) != size:
            raise ValueError(f"{len(states) if isinstance(states, list) else 'no'} entries for {size} ranks")
        for state in states:
            version, internal, gauss = state["rng"]["python"]
            random.Random().setstate((version, tuple(internal), gauss))
            name, keys, pos, has_gauss, cached = state["rng"]["numpy"]
            np.random.RandomState().set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, OSError) as exc:
        raise CheckpointError(f"{file} is not the ranks' saved state ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); the checkpoint is damaged: "
                              f"resume from another (move this one aside)") from None
    return states


#: ``plan["epochs"]`` of a prepared loop's resume: its message counts epochs as ``run.epoch`` does
OWN_LOOP_EPOCHS = "run.epoch"


def resume_where(position: Position, own_loop: bool = False) -> str:
    """Where a resume continues, as its loop counts: the Trainer's message names the epoch it prints
    (``epoch 2`` is the second, as in its ``epoch 2/3`` lines); a prepared loop's names ``run.epoch``
    (epochs completed: the value ``for epoch in run.epochs(N)`` continues with) and the update."""
    if own_loop:
        inside = f", {position.consumed} samples into it" if position.consumed else ", at its start"
        return f"epoch {position.epoch} (run.epoch){inside}, update {position.step}"
    return (f"epoch {position.epoch + 1}, after {position.consumed} samples"
            if position.consumed else f"epoch {position.epoch + 1}")


def restore(plan: dict[str, Any], adapter: Any, ctx: Any, gate: Any, output: Path | None,
            collective: bool = True) -> tuple[Position, list[dict[str, Any]], dict[str, Any] | None]:
    """Load the planned checkpoint (rank 0), hand every rank its RNG state and partial-epoch totals
    (one broadcast when ``collective``), and return the position, the metrics history and this
    rank's carried totals (None: a fresh start, or another world size: the caller reseeds).
    ``output``'s ``metrics.jsonl`` is cut back to the checkpoint; with ``output`` None no file is written."""
    if not plan.get("checkpoint"):
        return Position(), [], None
    manifest, path = plan["manifest"], Path(plan["checkpoint"])
    position = Position(int(manifest["epoch"]), int(manifest.get("consumed", 0)), int(manifest["step"]))
    history: list[dict[str, Any]] = [dict(r) for r in plan.get("history", [])]
    rank_states = None
    if ctx.is_main:
        adapter.load_state(path)
        if output is not None:  # None: a checkpoint loaded on its own, outside any run's output (nothing cut)
            atomic_write_text(output / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in history))
        rank_states = read_rank_states(path, int(manifest.get("world_size", ctx.size)))
    rank_states = adapter.broadcast_object(rank_states) if collective else None  # distributed
    saved_size = int(manifest.get("world_size", ctx.size))
    where = resume_where(position, plan.get("epochs") == OWN_LOOP_EPOCHS)
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
