"""What training carries and returns: the run's result, the state between steps, an epoch's totals,
and the lines rank 0 prints about them.

:class:`TrainingState` is what an elastic commit saves and a re-form restores (position, history,
partial totals, the last checkpoint); :class:`EpochStats` is one rank's running totals for the
epoch under way; :class:`RunResult` is what :func:`hvdtrain.train` returns on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvdtrain.core.resume import Position


@dataclass
class RunResult:
    """What a finished run returns on every rank (files exist on rank 0's disk)."""

    output: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: Path | None = None
    world_size: int = 1

    @property
    def final(self) -> dict[str, Any]:
        """The last epoch's metrics (empty if no epoch ran)."""
        return self.history[-1] if self.history else {}


@dataclass
class TrainingState:
    """What training carries between steps and, in elastic mode, between worker-set changes."""

    position: Position
    history: list[dict[str, Any]]
    carried: dict[str, Any] | None = None
    last_checkpoint: Path | None = None

    def commit(self) -> None:
        """A point training could be rolled back to (a no-op outside elastic mode)."""


@dataclass
class EpochStats:
    """This rank's running totals for one training epoch (``loss_sum`` may be a framework scalar
    on the device until :meth:`totals` reads it: no host synchronisation per step)."""

    global_step: int
    lr: float = 0.0
    loss_sum: Any = 0.0
    samples: int = 0

    def totals(self) -> dict[str, Any]:
        """The partial totals as plain numbers (what checkpoints and elastic commits carry)."""
        return {"loss_sum": float(self.loss_sum), "samples": self.samples}


def epoch_line(record: dict[str, Any]) -> str:
    """Rank 0's line after an epoch (``record``: the epoch's ``metrics.jsonl`` record)."""
    metrics = ["val_accuracy"] if "val_accuracy" in record else [  # else the task's own, none made up
        k for k, v in record.items() if k.startswith("val_") and k != "val_loss" and isinstance(v, (int, float))]
    shown = "".join(f"{k} {record[k]:.4f} " for k in metrics)
    if "val_loss" in record:  # absent without validation data
        shown = f"val_loss {record['val_loss']:.4f} " + shown
    return "epoch {epoch}: train_loss {train_loss:.4f} {shown}{samples_per_sec:.0f} samples/s".format(
        shown=shown, **record)


def done_line(config: Any, world_size: int, result: RunResult) -> str:
    """Rank 0's last line: the run, its epochs (and whether it stopped early), the final
    validation metrics, the throughput and the output folder."""
    final = result.final
    stopped = (final.get("early_stopping") or {}).get("stopped")
    epochs = f"{final['epoch']}/{config.train.epochs} (stopped early)" if stopped else config.train.epochs
    limit = config.train.max_steps
    if limit is not None and final.get("step", 0) >= limit:  # train.max_steps ended it
        epochs = f"{final['epoch']}/{config.train.epochs} steps={final['step']} (train.max_steps)"
    return (f"hvdtrain: done {config.recipe}/{config.framework} np={world_size} epochs={epochs} "
            + " ".join(f"{k}={final[k]:.4f}" for k in final if k.startswith("val_"))
            + (f" samples/s={final['samples_per_sec']:.0f}" if final else "")
            + f" output={result.output}")
