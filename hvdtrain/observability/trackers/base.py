"""What every tracker shares: the names ``log.trackers`` accepts, the error a tracker stops a run
with, the interface a tracker implements, and the run's config, tags and metrics as trackers take them."""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Any

from hvdtrain.core.config import TRACKER_NAMES, tracker_names
from hvdtrain.core.errors import TrainingError

TRACKERS = TRACKER_NAMES  # declared with log.trackers in hvdtrain/core/config_schema.py
REMOTE_TRACKERS = ("mlflow", "wandb")  # the ones with a run id kept in trackers.json
INSTALL_HINT = "pip install 'hvdtrain[trackers]' (mlflow-skinny==3.17.0, wandb==0.31.0)"
PARAM_VALUE_MAX = 500  # MLflow takes up to 6000 characters; W&B any: long lists are cut here


class TrackerError(TrainingError):
    """A tracker cannot be used (package missing, server unreachable, no login): the message names
    the tracker, where it was looked for and the fix."""


def parse_trackers(value: str | None) -> list[str]:
    """``log.trackers`` as a list of names in the order given (``none`` or empty: no tracker);
    checked where the key is declared (:func:`hvdtrain.core.config.tracker_names`: an unknown name
    is a ConfigError when the config is read)."""
    return tracker_names(value)


class Tracker:
    """One experiment tracker's run, written by rank 0. ``open`` returns the run's id (kept in
    trackers.json and given back to ``open`` on a resume)."""

    name = ""

    def open(self, run_id: str | None, run_name: str, params: dict[str, str], tags: dict[str, str]) -> str:
        """Start a new run (``run_id`` None) or continue ``run_id``; log ``params`` and ``tags``."""
        raise NotImplementedError

    def logged(self) -> tuple[set[int], int]:
        """What the (reopened) run already holds: its epochs and its last global step of step
        metrics (-1: none), as the tracker itself tells (its server, its files)."""
        return set(), -1

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set (or update) the run's tags."""

    def log_metrics(self, metrics: dict[str, float], step: int, kind: str) -> None:
        """``metrics`` at ``step``; ``kind`` is ``"step"`` (x: global step) or ``"epoch"`` (x: epoch)."""
        raise NotImplementedError

    def log_artifact(self, path: str, name: str) -> None:
        """Upload the folder ``path`` under ``name``."""

    def close(self, finished: bool) -> None:
        """Flush what is pending; ``finished``: the job ended (mark the run finished), else it
        only paused (an elastic handover: rank 0 moved to another process)."""


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config dict as ``{"train.epochs": "3", ...}`` (values as text, long ones cut)."""
    flat: dict[str, str] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, dotted + "."))
        else:
            text = "None" if value is None else str(value)
            flat[dotted] = text if len(text) <= PARAM_VALUE_MAX else text[:PARAM_VALUE_MAX - 3] + "..."
    return flat


def _version(module: str, *dists: str) -> str | None:
    loaded = sys.modules.get(module)  # the framework is loaded by the adapter: read, never import
    if loaded is not None and getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def run_tags(config: Any, world_size: int) -> dict[str, str]:
    """The tags of a run: framework, recipe, world size, and the versions of hvdtrain, the framework and Horovod."""
    from hvdtrain._version import __version__

    tags = {"hvdtrain.framework": config.framework, "hvdtrain.recipe": config.recipe,
            "hvdtrain.world_size": str(world_size), "hvdtrain.version": __version__}
    framework = (("torch", ("torch",)) if config.framework == "torch"
                 else ("tensorflow", ("tensorflow", "tensorflow-cpu")))
    for name, (module, dists) in (("framework_version", framework), ("horovod_version", ("horovod", ("horovod",)))):
        found = _version(module, *dists)
        if found:
            tags[f"hvdtrain.{name}"] = found
    return tags


def numbers(record: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, float]:
    """The numbers of a metrics line (booleans and text left out)."""
    return {k: float(v) for k, v in record.items()
            if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)}
