"""``<output>/trackers.json``: which tracker run a job's output belongs to, and how far it was logged.

``{"mlflow": {"run_id": ..., "epochs": 3, "step": 150}, "wandb": {...}}`` (``epochs`` and ``step``:
how many epochs and up to which global step this process logged, for people reading it). A resumed
job (or an elastic re-form whose rank 0 is another process) reopens the run under that id, asks the
tracker which epochs it really holds (a killed process loses what it had not sent) and logs the rest. Written by rank 0 with :func:`~hvdtrain.core.durable.atomic_write_text`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvdtrain.core.durable import atomic_write_text

RUN_FILE = "trackers.json"


def read_runs(output: str | Path) -> dict[str, dict[str, Any]]:
    """The runs recorded in ``output`` (empty when none; a damaged file is a warning's matter:
    it reads as empty and a new run is opened)."""
    path = Path(output) / RUN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict) and v.get("run_id")} if isinstance(data, dict) else {}


def write_runs(output: str | Path, runs: dict[str, dict[str, Any]]) -> None:
    """Record ``runs`` in ``output`` (atomically)."""
    atomic_write_text(Path(output) / RUN_FILE, json.dumps(runs, indent=1, sort_keys=True) + "\n")
