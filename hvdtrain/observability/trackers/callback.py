"""The callback that feeds the MLflow and W&B trackers from rank 0 (TensorBoard keeps its own,
:class:`~hvdtrain.observability.tensorboard_log.TensorBoardCallback`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.config import to_dict
from hvdtrain.core.redact import redact_uri, redact_values
from hvdtrain.core.rank0 import RankZeroGate
from hvdtrain.core.resume import METRICS_FILE, read_metrics
from hvdtrain.observability.trackers.base import REMOTE_TRACKERS, Tracker, flatten, numbers, parse_trackers, run_tags
from hvdtrain.observability.trackers.runfile import read_runs, write_runs

EPOCH_SKIP_KEYS = ("epoch", "world_size", "step")


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    parts: list[str] = []
    for n in numbers:
        if parts and int(parts[-1].split("-")[-1]) == n - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def make_tracker(name: str, config: Any, output: Path) -> Tracker:
    """The tracker called ``name`` (its package imported now)."""
    if name == "mlflow":
        from hvdtrain.observability.trackers.mlflow_tracker import MlflowTracker

        return MlflowTracker(config)
    from hvdtrain.observability.trackers.wandb_tracker import WandbTracker

    return WandbTracker(config, str(output))


class TrackersCallback(Callback):
    """Rank 0 opens (or, with the id in trackers.json, reopens) one run per tracker in
    ``log.trackers`` other than TensorBoard and logs to it.

    An elastic re-form calls ``on_train_begin`` again: the process that stays rank 0 keeps its runs
    (tags updated: the world size), one that stops being rank 0 lets go of them, a new rank 0
    reopens them from trackers.json. An epoch (or step) the run already has is not logged again.
    A tracker that fails while training is dropped with one warning: training goes on.
    """

    def __init__(self, config: Any):
        self.names = [n for n in parse_trackers(config.log.trackers) if n in REMOTE_TRACKERS]
        self.trackers: dict[str, Tracker] = {}
        self.runs: dict[str, dict[str, Any]] = {}  # name -> {"run_id", "step": last step logged}
        self.logged: dict[str, set[int]] = {}  # name -> the epochs the run holds
        self.main, self.output, self.every = False, Path(config.output), config.train.log_every

    # -- opening ---------------------------------------------------------------------------------
    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        config, self.gate = info["config"], RankZeroGate(ctx.rank)
        self.output, self.config = Path(info["output"]), config
        if not ctx.is_main:
            if self.trackers:  # rank 0 moved to another process (elastic): it continues the runs
                self._close(finished=False)
            self.main = False
            return
        self.main = True
        tags = redact_values(run_tags(config, int(info["world_size"])))
        if self.trackers:  # an elastic re-form: the same process is still rank 0
            self._each(lambda t: t.set_tags(tags))
            return
        recorded = read_runs(self.output)
        params = flatten(redact_values(info.get("config_ran") or to_dict(config)))  # what ran; secrets in URIs: never
        run_name = config.log.run_name or self.output.resolve().name
        for name in self.names:
            previous = recorded.get(name, {})
            try:  # checked before training (preflight); a failure here only loses this tracker
                tracker = make_tracker(name, config, self.output)
                run_id = tracker.open(previous.get("run_id"), run_name, params, tags)
                epochs, step = tracker.logged() if previous else (set(), -1)
            except Exception as exc:
                self.gate.warn(f"log.trackers: {name} could not open its run ({type(exc).__name__}: "
                               f"{str(exc)[:200]}); training goes on without it")
                continue
            self.trackers[name] = tracker
            self.logged[name], self.runs[name] = epochs, {"run_id": run_id, "step": step}
            if not previous:
                self.gate.print(f"hvdtrain: {name} run {run_id}" + self._where(name, tracker))
            else:
                self.gate.print(f"hvdtrain: {name} run {run_id} continued (epochs it holds: "
                                f"{_ranges(sorted(epochs)) or 'none'})")
        self._save()
        self._catch_up(int(info["start_epoch"]))

    @staticmethod
    def _where(name: str, tracker: Any) -> str:
        return f" at {redact_uri(tracker.uri)}" if name == "mlflow" else f" in {tracker.dir}/wandb"

    def _catch_up(self, start_epoch: int) -> None:
        """Epochs in metrics.jsonl a tracker missed (a kill between the line and the tracker's log)."""
        rows, _ = read_metrics(self.output / METRICS_FILE)
        for row in rows:
            if isinstance(row.get("epoch"), int) and row["epoch"] <= start_epoch:
                self._log_epoch(row)

    # -- logging -----------------------------------------------------------------------------------
    def on_step_end(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        if not (self.main and self.trackers and self.every and (step + 1) % self.every == 0):
            return
        global_step = int(logs["global_step"])
        values = {"loss": float(logs["loss"]), "lr": float(logs["lr"]),
                  "samples_per_sec": float(logs["samples_per_sec"])}
        for name in list(self.trackers):
            if global_step > self.runs[name]["step"]:
                self._call(name, lambda t: t.log_metrics(values, global_step, "step"))
                if name in self.runs:
                    self.runs[name]["step"] = global_step

    def on_epoch_end(self, epoch: int, record: dict[str, Any]) -> None:
        if self.main and self.trackers:
            self._log_epoch(record)

    def _log_epoch(self, record: dict[str, Any]) -> None:
        number = int(record.get("epoch", 0))
        values = numbers(record, EPOCH_SKIP_KEYS)
        for name in list(self.trackers):
            if number not in self.logged[name]:
                self._call(name, lambda t: t.log_metrics(values, number, "epoch"))
                if name in self.trackers:
                    self.logged[name].add(number)
        self._save()

    def on_train_end(self, result: Any) -> None:
        if not (self.main and self.trackers):
            return
        checkpoint = self._checkpoint(result)
        if checkpoint is not None:
            label = f"checkpoint-{self.config.log.log_checkpoint}"
            self._each(lambda t: t.log_artifact(str(checkpoint), label))
        self._save()
        self._close(finished=True)

    def _checkpoint(self, result: Any) -> Path | None:
        which = self.config.log.log_checkpoint
        if which == "final":
            return Path(result.checkpoint) if getattr(result, "checkpoint", None) else None
        if which == "best":
            from hvdtrain.core.checkpoint import CheckpointManager

            ck = self.config.checkpoint
            best = CheckpointManager(self.output / "checkpoints", ck.keep_last, ck.best_metric, ck.best_mode).best()
            return Path(best.path) if best is not None else None
        return None

    # -- plumbing ----------------------------------------------------------------------------------
    def _call(self, name: str, action: Any) -> None:
        try:
            action(self.trackers[name])
        except Exception as exc:  # a tracker lost mid-run must not lose the training
            self.gate.warn(f"log.trackers: {name} failed ({type(exc).__name__}: {str(exc)[:200]}); it is dropped "
                           f"for the rest of this run (metrics.jsonl has every epoch; --resume catches it up)")
            self.trackers.pop(name, None)

    def _each(self, action: Any) -> None:
        for name in list(self.trackers):
            self._call(name, action)

    def _save(self) -> None:
        if self.runs:
            write_runs(self.output, {name: {**run, "epochs": len(self.logged[name])} for name, run in self.runs.items()})

    def _close(self, finished: bool) -> None:
        for name in list(self.trackers):
            self._call(name, lambda t: t.close(finished))
        self.trackers = {}
