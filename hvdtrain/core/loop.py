"""The framework-neutral training loop: epochs, steps, evaluation, metrics, checkpoints, resume.

:class:`Trainer` drives a recipe's :class:`~hvdtrain.core.task.TrainTask` through a
:class:`~hvdtrain.core.adapter.FrameworkAdapter`. Every rank runs the same number of steps per
epoch by construction (equal shards, same batch count). Rank 0 decides whether and where to
resume and broadcasts the decision, so all ranks agree or all stop with the same error.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hvdtrain
from hvdtrain.core import sharding
from hvdtrain.core.adapter import DistContext, FrameworkAdapter, load_adapter
from hvdtrain.core.callbacks import Callback, CallbackList
from hvdtrain.core.checkpoint import CheckpointManager, atomic_write_text
from hvdtrain.core.config import RunConfig, dump_yaml, to_dict
from hvdtrain.core.prefetch import prefetch
from hvdtrain.core.rank0 import RankZeroGate
from hvdtrain.core.registry import get_builder, get_recipe
from hvdtrain.core.schedule import build_schedule

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"


class TrainingError(RuntimeError):
    """Training cannot start or continue; the message says why and what to do."""


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


def _check_output_dir(output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    probe = output / f".hvdtrain-write-test-{os.getpid()}"
    try:
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise TrainingError(f"output directory {output} is not writable: {exc}") from None


def _plan_start(config: RunConfig, manager: CheckpointManager, output: Path) -> dict[str, Any]:
    """Rank 0's decision: where to start, or the error every rank should raise."""
    try:
        _check_output_dir(output)
        existing = manager.checkpoints()
        if not config.checkpoint.resume:
            if existing:
                return {"error": f"output directory {output} already holds checkpoints "
                                 f"({existing[-1].path.name}); pass --resume to continue that run or choose "
                                 f"another --output (nothing was changed)"}
            return {"checkpoint": None, "epoch": 0}
        latest = manager.latest()
        if latest is None:
            return {"checkpoint": None, "epoch": 0,
                    "note": f"--resume: no checkpoint in {manager.directory}; starting from scratch"}
        for key in ("recipe", "framework"):
            if latest.manifest.get(key) != getattr(config, key):
                return {"error": f"cannot resume: checkpoint {latest.path} is from {key} "
                                 f"{latest.manifest.get(key)!r}, this run uses {getattr(config, key)!r} "
                                 f"(nothing was changed)"}
        return {"checkpoint": str(latest.path), "epoch": latest.epoch,
                "saved_world_size": latest.manifest.get("world_size")}
    except Exception as exc:  # every rank must hear about it, or the others hang in the broadcast
        return {"error": str(exc)}


def _previous_history(output: Path, upto_epoch: int) -> list[dict[str, Any]]:
    path = output / METRICS_FILE
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("epoch", 0) <= upto_epoch]


@dataclass
class EpochStats:
    """This rank's totals for one training epoch."""

    global_step: int
    lr: float = 0.0
    loss_sum: float = 0.0
    samples: int = 0


class Trainer:
    """Runs one recipe on one framework with the given config."""

    def __init__(self, config: RunConfig, adapter: FrameworkAdapter | None = None,
                 callbacks: list[Callback] | tuple[Callback, ...] = ()):
        self.config = config
        self.adapter = adapter or load_adapter(config.framework)
        self.callbacks = CallbackList(callbacks)

    def fit(self) -> RunResult:
        """Train for ``config.train.epochs`` epochs (from the resume point) and return the history."""
        cfg, adapter = self.config, self.adapter
        builder = get_builder(cfg.recipe, cfg.framework)
        ctx = adapter.init(cfg)
        gate = RankZeroGate(ctx.rank)
        output = Path(cfg.output)
        manager = CheckpointManager(output / "checkpoints", cfg.checkpoint.keep_last)

        plan = adapter.broadcast_object(_plan_start(cfg, manager, output) if ctx.is_main else None)
        if plan.get("error"):
            raise TrainingError(plan["error"])
        if plan.get("note"):
            gate.warn(plan["note"])

        task = builder(cfg, ctx)
        n_train = len(task.train_data)
        if n_train < ctx.size:
            raise TrainingError(f"{n_train} training samples cannot be shared by {ctx.size} workers")
        adapter.prepare(task, cfg)

        start_epoch = int(plan["epoch"])
        history: list[dict[str, Any]] = []
        if plan.get("checkpoint"):
            if ctx.is_main:
                adapter.load_state(Path(plan["checkpoint"]))
                history = _previous_history(output, start_epoch)
                atomic_write_text(output / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in history))
            saved = plan.get("saved_world_size")
            gate.print(f"hvdtrain: resuming from {plan['checkpoint']} at epoch {start_epoch + 1}"
                       + (f" (saved with {saved} workers, now {ctx.size}: data resharded, LR rescaled)"
                          if saved and saved != ctx.size else ""))
        adapter.broadcast_state(root_rank=0)
        if ctx.is_main:
            atomic_write_text(output / CONFIG_FILE, dump_yaml(cfg))

        per_rank = sharding.shard_size(n_train, ctx.size, cfg.data.remainder)
        micro_steps = math.ceil(per_rank / cfg.train.batch_size)
        opt_steps_per_epoch = math.ceil(micro_steps / cfg.train.grad_accumulation)
        schedule = build_schedule(cfg.optim, ctx.size, opt_steps_per_epoch, cfg.train.epochs)
        global_step = start_epoch * opt_steps_per_epoch
        gate.print(f"hvdtrain: {cfg.recipe}/{cfg.framework} on {ctx.size} worker(s): {n_train} train / "
                   f"{len(task.val_data)} val samples, {micro_steps} steps/epoch of {cfg.train.batch_size} "
                   f"per worker, peak LR {schedule.peak_lr:g}")

        last_checkpoint = Path(plan["checkpoint"]) if plan.get("checkpoint") else None
        self.callbacks.on_train_begin(ctx, {"config": cfg, "output": output, "start_epoch": start_epoch,
                                            "steps_per_epoch": micro_steps, "world_size": ctx.size})
        for epoch in range(start_epoch, cfg.train.epochs):
            started = time.perf_counter()
            stats = self._train_epoch(task, ctx, gate, epoch, schedule, global_step)
            global_step = stats.global_step
            totals = adapter.allreduce_sums({"loss_sum": stats.loss_sum, "samples": float(stats.samples),
                                             "time": time.perf_counter() - started})
            val = self._evaluate(task, ctx)
            record = {
                "epoch": epoch + 1,
                "train_loss": totals["loss_sum"] / totals["samples"],
                **{f"val_{k}": v for k, v in val.items()},
                "samples_per_sec": totals["samples"] / (totals["time"] / ctx.size),
                "epoch_time_sec": time.perf_counter() - started,
                "lr": stats.lr,
                "world_size": ctx.size,
                "step": global_step,
            }
            history.append(record)
            if cfg.checkpoint.enabled and ctx.is_main:
                info = manager.save(f"epoch-{epoch + 1:04d}", adapter.save_state, {
                    "epoch": epoch + 1, "step": global_step, "recipe": cfg.recipe,
                    "framework": cfg.framework, "world_size": ctx.size, "config": to_dict(cfg),
                    "metrics": record, "hvdtrain_version": hvdtrain.__version__,
                })
                last_checkpoint = info.path
            gate.append_jsonl(output / METRICS_FILE, record)
            self.callbacks.on_epoch_end(epoch, record)
            gate.print("epoch {epoch}: train_loss {train_loss:.4f} val_loss {val_loss:.4f} "
                       "val_accuracy {acc:.4f} {samples_per_sec:.0f} samples/s".format(
                           acc=record.get("val_accuracy", float("nan")), **record))

        result = RunResult(output, history, last_checkpoint, ctx.size)
        if task.export is not None and ctx.is_main:
            task.export(output)
        self.callbacks.on_train_end(result)
        final = result.final
        gate.print(f"hvdtrain: done {cfg.recipe}/{cfg.framework} np={ctx.size} epochs={cfg.train.epochs} "
                   + " ".join(f"{k}={final[k]:.4f}" for k in final if k.startswith("val_"))
                   + (f" samples/s={final['samples_per_sec']:.0f}" if final else "")
                   + f" output={output}")
        return result

    def _train_epoch(self, task: Any, ctx: DistContext, gate: RankZeroGate, epoch: int, schedule: Any,
                     global_step: int) -> "EpochStats":
        """One pass over this rank's shard: LR per optimizer step, accumulation, progress lines."""
        cfg, adapter = self.config, self.adapter
        accum = cfg.train.grad_accumulation
        indices = sharding.train_shard(len(task.train_data), ctx.rank, ctx.size, epoch, cfg.train.seed,
                                       cfg.data.shuffle, cfg.data.remainder)
        batch_list = sharding.batches(indices, cfg.train.batch_size)
        stats = EpochStats(global_step=global_step)
        started = time.perf_counter()
        loaded = prefetch(batch_list, lambda idx: task.train_data.get_batch(idx, epoch), cfg.data.prefetch_batches)
        for i, (inputs, targets) in enumerate(loaded):
            if i % accum == 0:
                stats.lr = schedule(stats.global_step)
                adapter.set_learning_rate(stats.lr)
            apply = (i + 1) % accum == 0 or i == len(batch_list) - 1
            loss = adapter.train_step(inputs, targets, apply_update=apply)
            stats.global_step += int(apply)
            stats.loss_sum += loss * len(targets)
            stats.samples += len(targets)
            rate = stats.samples * ctx.size / (time.perf_counter() - started)
            self.callbacks.on_step_end(epoch, i, {"loss": loss, "lr": stats.lr, "global_step": stats.global_step,
                                                  "samples": stats.samples, "samples_per_sec": rate,
                                                  "steps": len(batch_list)})
            if cfg.train.log_every and (i + 1) % cfg.train.log_every == 0:
                gate.print(f"epoch {epoch + 1}/{cfg.train.epochs} step {i + 1}/{len(batch_list)} "
                           f"loss {loss:.4f} lr {stats.lr:.4g} {rate:.0f} samples/s")
        return stats

    def _evaluate(self, task: Any, ctx: DistContext) -> dict[str, float]:
        """Validation metrics over the whole validation set, each sample counted once."""
        data = task.val_data
        indices = sharding.eval_shard(len(data), ctx.rank, ctx.size)
        sums: dict[str, float] = {}
        for inputs, targets in prefetch(sharding.batches(indices, self.config.train.batch_size),
                                        lambda idx: data.get_batch(idx, -1), self.config.data.prefetch_batches):
            for k, v in self.adapter.eval_step(inputs, targets).items():
                sums[k] = sums.get(k, 0.0) + v
        keys = self.adapter.broadcast_object(sorted(sums) if ctx.is_main else None)
        totals = self.adapter.allreduce_sums({k: sums.get(k, 0.0) for k in keys})
        return {"loss": totals["loss_sum"] / max(1.0, totals["count"]), **task.finalize_metrics(totals)}


def train(config: RunConfig, callbacks: list[Callback] | tuple[Callback, ...] = ()) -> RunResult:
    """Run ``config`` in this process (under horovodrun/mpirun, every worker calls this)."""
    get_recipe(config.recipe)
    return Trainer(config, callbacks=callbacks).fit()
