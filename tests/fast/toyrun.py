"""Running recipe ``toy`` in-process and reading what the run left: shared by the fast tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numpy_adapter import DEFAULTS, RECIPE, NumpyAdapter

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.config import load_config
from hvdtrain.core.loop import RunResult
from hvdtrain.trainer import Trainer

# metrics.jsonl fields that measure time, not training: they differ between any two runs
TIMING_FIELDS = ("samples_per_sec", "epoch_time_sec", "checkpoint_sec")


@dataclass
class Run:
    """One in-process training run's config, adapter and outcome."""

    output: Path
    overrides: list[str]
    adapter: NumpyAdapter = field(default_factory=NumpyAdapter)
    result: RunResult | None = None

    @property
    def checkpoints(self) -> Path:
        return self.output / "checkpoints"

    def names(self) -> list[str]:
        """The published checkpoints' folder names, sorted (what a resume could use)."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(p.name for p in self.checkpoints.iterdir() if not p.name.startswith("."))

    def aside(self) -> list[str]:
        """Folders under checkpoints/ that are not published checkpoints (moved aside, temporary)."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(p.name for p in self.checkpoints.iterdir() if p.name.startswith("."))

    def manifest(self, name: str) -> dict[str, Any]:
        return json.loads((self.checkpoints / name / "manifest.json").read_text())

    def metrics(self) -> list[dict[str, Any]]:
        path = self.output / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def toy_config(output: Path, *overrides: str):
    """A config for recipe ``toy`` writing into ``output`` (quiet: no TensorBoard, no progress bar)."""
    return load_config(DEFAULTS, overrides=[f"recipe={RECIPE}", "framework=torch", f"output={output}",
                                            "train.tensorboard=false", "train.progress_bar=false", *overrides])


def fit(output: Path, *overrides: str, callbacks=(), adapter: NumpyAdapter | None = None) -> Run:
    """Train recipe ``toy`` in this process; returns the :class:`Run` (exceptions propagate)."""
    run = Run(Path(output), list(overrides), adapter or NumpyAdapter())
    run.result = Trainer(toy_config(output, *overrides), adapter=run.adapter, callbacks=list(callbacks)).fit()
    return run


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def snapshot_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes (to show nothing changed)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


class Interrupt(Exception):
    """Stands for the process dying: raised out of fit() at a chosen optimizer step."""


class StopAt(Callback):
    """Raises :class:`Interrupt` once the run reaches optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, epoch, step, logs):
        if logs["global_step"] == self.step:
            raise Interrupt(f"stopped at step {self.step}")
