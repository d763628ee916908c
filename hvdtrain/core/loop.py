"""The framework-neutral training loop: epochs, steps, evaluation, metrics, checkpoints, resume.

:class:`Trainer` drives a recipe's :class:`~hvdtrain.core.task.TrainTask` through a
:class:`~hvdtrain.core.adapter.FrameworkAdapter`. Every rank runs the same number of steps per
epoch by construction (equal shards, same batch count). Rank 0 decides whether and where to
resume and broadcasts the decision, so all ranks agree or all stop with the same error.

A checkpoint records the position inside the epoch (how much of the epoch's shuffled order has
been consumed) and every rank's random-number state, so a resumed run continues at the next
unseen batch and, with the same world size, ends bitwise equal to an uninterrupted run.

Progress is that position in the data, (epoch, samples consumed), which means the same for any
number of workers: the LR schedule is evaluated at it (:func:`~hvdtrain.core.schedule.schedule_step`)
and checkpoints are ordered by it. The optimizer-step counter only counts the updates actually
taken; it is carried unchanged across resumes and re-forms, so step checkpoint names never repeat.
Before every evaluation and mid-epoch checkpoint the model's running statistics (BatchNorm) are
averaged over the ranks, so every rank evaluates, and rank 0 saves, one and the same model.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import hvdtrain
from hvdtrain.core import compression_state, faults, rules, sharding
from hvdtrain.core.adapter import DistContext, FrameworkAdapter, NonFiniteGradientError, load_adapter
from hvdtrain.core.callbacks import Callback, CallbackList
from hvdtrain.core.checkpoint import CheckpointInfo, CheckpointManager, atomic_write_text
from hvdtrain.core.config import RunConfig, dump_yaml, to_dict
from hvdtrain.core.hosts import describe_workers
from hvdtrain.core.prefetch import prefetch
from hvdtrain.core.rank0 import RankZeroGate
from hvdtrain.core.registry import get_builder, get_recipe
from hvdtrain.core.schedule import build_schedule, schedule_step
from hvdtrain.core.visibility import default_callbacks
from hvdtrain.core.watchdog import StallWatchdog

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
RANK_STATE_FILE = "rank_state.json"
# Config keys that decide the shape of the saved state or the meaning of its position (the epoch's
# batches, the accumulation windows): resuming across a change is refused.
STATE_DEFINING_KEYS = ("model", "optim.name", "train.batch_size", "train.grad_accumulation")


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


@dataclass
class Position:
    """Where training stands: completed epochs, positions of the current epoch's order already
    consumed, optimizer steps taken."""

    epoch: int = 0
    consumed: int = 0
    step: int = 0


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


def _check_output_dir(output: Path) -> None:
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


def _incompatibility(info: CheckpointInfo, config: RunConfig) -> str | None:
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


def _plan_start(config: RunConfig, manager: CheckpointManager, output: Path) -> dict[str, Any]:
    """Rank 0's decision: where to start, or the error every rank should raise."""
    try:
        _check_output_dir(output)
        manager.remove_temporaries()
        existing = manager.checkpoints()
        if not config.checkpoint.resume:
            if existing:
                return {"error": f"output directory {output} already holds checkpoints "
                                 f"({existing[-1].path.name}); pass --resume to continue that run or choose "
                                 f"another --output (nothing was changed)"}
            return {"checkpoint": None}
        notes: list[str] = []
        latest, damaged = None, []
        for info in reversed(existing):
            problem = manager.verify(info.path, info.manifest)
            if problem is None:
                latest = info
                break
            notes.append(problem)
            damaged.append(info)
        if latest is not None:
            problem = _incompatibility(latest, config)
            if problem:
                return {"error": problem}
        for info in damaged:  # out of the way of the checkpoints this run will write, but kept
            notes.append(f"moved damaged checkpoint {info.path.name} aside to {manager.quarantine(info).name}")
        if latest is None:
            notes.append(f"--resume: no usable checkpoint in {manager.directory}; starting from scratch")
            return {"checkpoint": None, "notes": notes}
        if damaged:
            notes.append(f"falling back to checkpoint {latest.path}")
        return {"checkpoint": str(latest.path), "manifest": latest.manifest, "notes": notes}
    except Exception as exc:  # every rank must hear about it, or the others hang in the broadcast
        return {"error": str(exc)}


def _previous_history(output: Path, upto_epoch: int) -> list[dict[str, Any]]:
    path = output / METRICS_FILE
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("epoch", 0) <= upto_epoch]


def _python_numpy_rng() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def _set_python_numpy_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def _framework_version(framework: str) -> str:
    names = {"torch": ("torch",), "tensorflow": ("tensorflow-cpu", "tensorflow", "tensorflow_cpu")}[framework]
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


class Trainer:
    """Runs one recipe on one framework with the given config."""

    def __init__(self, config: RunConfig, adapter: FrameworkAdapter | None = None,
                 callbacks: list[Callback] | tuple[Callback, ...] = ()):
        self.config = config
        self.adapter = adapter or load_adapter(config.framework, config.parallel.pipeline_stages)
        self.callbacks = CallbackList([*default_callbacks(config), *callbacks])  # TensorBoard, progress bar

    def fit(self) -> RunResult:
        """Train for ``config.train.epochs`` epochs (from the resume point) and return the history."""
        cfg, adapter = self.config, self.adapter
        builder = get_builder(cfg.recipe, cfg.framework)
        rules.check(cfg)  # the rulebook: what reads only the config, before Horovod starts
        ctx = self.ctx = adapter.init(cfg)
        rules.check(cfg, rules.World(ctx.size, ctx.mpi, ctx.gpu))  # ... and what needs the job
        with StallWatchdog(cfg.train.stall_timeout_sec, ctx.rank) as self.watchdog:
            return self._fit(builder)

    def _fit(self, builder: Any) -> RunResult:
        cfg, adapter, ctx = self.config, self.adapter, self.ctx
        gate = self.gate = RankZeroGate(ctx.rank)
        output = self.output = Path(cfg.output)
        self.manager = CheckpointManager(output / "checkpoints", cfg.checkpoint.keep_last,
                                         cfg.checkpoint.best_metric, cfg.checkpoint.best_mode)

        elastic = cfg.train.elastic
        if elastic:
            # Before the elastic loop every step must be local: a worker that joins later runs this
            # prelude while the others are already inside the loop. Rank 0's position and weights
            # reach the others in the elastic state's first sync.
            plan = _plan_start(cfg, self.manager, output) if ctx.is_main else {"checkpoint": None}
        else:
            plan = adapter.broadcast_object(_plan_start(cfg, self.manager, output) if ctx.is_main else None)
            where = describe_workers(adapter)  # hvdtrain.core.hosts: same versions on every host
            if where:
                gate.print(where)
        if plan.get("error"):
            raise TrainingError(plan["error"])
        for note in plan.get("notes", []):
            gate.warn(note)

        self.watchdog.beat(0, "building the recipe's model and data")
        task = builder(cfg, ctx)
        rules.check_task(task, cfg)
        n_train = len(task.train_data)
        if n_train < ctx.size:
            raise TrainingError(f"{n_train} training samples cannot be shared by {ctx.size} workers")
        if len(task.val_data) == 0:
            raise TrainingError("the validation set is empty")
        self.watchdog.beat(0, "preparing the model and optimizer")
        adapter.prepare(task, cfg)
        self.watchdog.beat(0, "restoring the checkpoint")

        position, history, carried = self._restore(plan, collective=not elastic)
        if not elastic:
            adapter.broadcast_state(root_rank=0)
            if carried is None:  # a fresh start, or a resume on another number of workers
                self._reseed(position)
        compression_state.restore(adapter, plan, ctx.rank, ctx.size, collective=not elastic)  # per-rank comm state
        if ctx.is_main:
            atomic_write_text(output / CONFIG_FILE, dump_yaml(cfg))
        state = TrainingState(position, history, carried,
                              Path(plan["checkpoint"]) if plan.get("checkpoint") else None)
        if cfg.train.elastic:
            from hvdtrain.core.elastic import run_elastic

            result = run_elastic(self, lambda st: self._run_epochs(task, st), state)
        else:
            result = self._run_epochs(task, state)
        if task.export is not None and self.ctx.is_main:
            task.export(output)
        self.callbacks.on_train_end(result)
        final = result.final
        self.gate.print(f"hvdtrain: done {cfg.recipe}/{cfg.framework} np={self.ctx.size} epochs={cfg.train.epochs} "
                        + " ".join(f"{k}={final[k]:.4f}" for k in final if k.startswith("val_"))
                        + (f" samples/s={final['samples_per_sec']:.0f}" if final else "")
                        + f" output={output}")
        return result

    def _reseed(self, position: Position) -> None:
        """Give this rank its own framework random stream (dropout masks differ between ranks,
        as their data do), drawn from (seed, rank, position): reproducible for a given run."""
        seed = np.random.SeedSequence([self.config.train.seed, self.ctx.rank, position.epoch,
                                       position.consumed]).generate_state(1)[0]
        self.adapter.reseed(int(seed))

    def _steps(self, task: Any) -> tuple[int, int]:
        """Micro-batches and optimizer steps per epoch at the current world size."""
        cfg = self.config
        per_rank = sharding.shard_size(len(task.train_data), self.ctx.data_size, cfg.data.remainder)
        micro_steps = math.ceil(per_rank / cfg.train.batch_size)
        return micro_steps, math.ceil(micro_steps / cfg.train.grad_accumulation)

    def _run_epochs(self, task: Any, state: "TrainingState") -> RunResult:
        """The epochs from ``state.position`` on. In elastic mode Horovod calls this again after a
        worker joins or leaves, with the state of the last commit and a new world size."""
        cfg, adapter, ctx, gate = self.config, self.adapter, self.ctx, self.gate
        micro_steps, opt_steps_per_epoch = self._steps(task)
        schedule = build_schedule(cfg.optim, ctx.data_size, opt_steps_per_epoch, cfg.train.epochs, cfg.train.grad_accumulation)
        position = state.position
        gate.print(f"hvdtrain: {cfg.recipe}/{cfg.framework} on {ctx.size} worker(s): {len(task.train_data)} train / "
                   f"{len(task.val_data)} val samples, {micro_steps} steps/epoch of {cfg.train.batch_size} "
                   f"per worker, peak LR {schedule.peak_lr:g}")
        self.callbacks.on_train_begin(ctx, {"config": cfg, "output": self.output, "start_epoch": position.epoch,
                                            "steps_per_epoch": micro_steps, "world_size": ctx.size})
        global_step = position.step
        for epoch in range(position.epoch, cfg.train.epochs):
            started = time.perf_counter()
            resumed_here = epoch == position.epoch and position.consumed > 0
            stats = EpochStats(global_step=global_step)
            if resumed_here and state.carried:
                stats.loss_sum, stats.samples = state.carried["loss_sum"], state.carried["samples"]
            skipped_before = adapter.skipped_updates
            self._train_epoch(task, epoch, schedule, stats, position.consumed if resumed_here else 0, state)
            global_step = stats.global_step
            totals = adapter.allreduce_sums({"loss_sum": stats.loss_sum, "samples": float(stats.samples),
                                             "time": time.perf_counter() - started,
                                             "skipped": float(adapter.skipped_updates - skipped_before)})
            adapter.sync_replicas()  # local SGD: evaluate (and checkpoint) the averaged model
            val = self._evaluate(task, ctx)
            record = {
                "epoch": epoch + 1,
                "train_loss": totals["loss_sum"] / max(1.0, totals["samples"]),
                **{f"val_{k}": v for k, v in val.items()},
                "samples_per_sec": totals["samples"] / max(1e-9, totals["time"] / ctx.data_size),
                "epoch_time_sec": time.perf_counter() - started,
                "lr": stats.lr,
                "world_size": ctx.size,
                "step": stats.global_step,
            }
            if totals["skipped"]:
                record["skipped_updates"] = int(totals["skipped"] / ctx.size)
            state.history.append(record)
            if cfg.checkpoint.enabled:
                save_started = time.perf_counter()
                saved = self._save_checkpoint(f"epoch-{epoch + 1:04d}", Position(epoch + 1, 0, stats.global_step),
                                              EpochStats(stats.global_step), record)
                state.last_checkpoint = saved or state.last_checkpoint
                record["checkpoint_sec"] = time.perf_counter() - save_started  # rank 0: gather + write
            gate.append_jsonl(self.output / METRICS_FILE, record)
            self.callbacks.on_epoch_end(epoch, record)
            gate.print("epoch {epoch}: train_loss {train_loss:.4f} val_loss {val_loss:.4f} "
                       "val_accuracy {acc:.4f} {samples_per_sec:.0f} samples/s".format(
                           acc=record.get("val_accuracy", float("nan")), **record))
            state.position, state.carried = Position(epoch + 1, 0, stats.global_step), None
            state.commit()
        return RunResult(self.output, state.history, state.last_checkpoint, ctx.size)

    def _restore(self, plan: dict[str, Any], collective: bool = True):
        """Load the planned checkpoint (rank 0), hand every rank its RNG state and partial-epoch
        totals, and return the position, the metrics history and this rank's carried totals."""
        cfg, ctx, adapter, gate = self.config, self.ctx, self.adapter, self.gate
        if not plan.get("checkpoint"):
            return Position(), [], None
        manifest, path = plan["manifest"], Path(plan["checkpoint"])
        position = Position(int(manifest["epoch"]), int(manifest.get("consumed", 0)), int(manifest["step"]))
        history: list[dict[str, Any]] = []
        rank_states = None
        if ctx.is_main:
            adapter.load_state(path)
            history = _previous_history(self.output, position.epoch)
            atomic_write_text(self.output / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in history))
            if (path / RANK_STATE_FILE).is_file():
                rank_states = json.loads((path / RANK_STATE_FILE).read_text())
        rank_states = adapter.broadcast_object(rank_states) if collective else None
        saved_size = int(manifest.get("world_size", ctx.size))
        where = (f"epoch {position.epoch + 1}, after {position.consumed} samples"
                 if position.consumed else f"epoch {position.epoch + 1}")
        if saved_size == ctx.size and rank_states:
            mine = rank_states[ctx.rank]
            _set_python_numpy_rng(mine["rng"])
            adapter.set_rng_state(mine["rng"]["framework"])
            gate.print(f"hvdtrain: resuming from {path} at {where}")
            return position, history, mine
        # The step counter keeps counting the updates taken; the LR follows the position (schedule_step).
        gate.print(f"hvdtrain: resuming from {path} at {where} (saved with {saved_size} workers, now "
                   f"{ctx.size}: the rest of the epoch is resharded, the LR rescaled and random streams reseeded)")
        return position, history, None

    def _train_epoch(self, task: Any, epoch: int, schedule: Any, stats: EpochStats, start: int,
                     state: "TrainingState") -> None:
        """One pass over this rank's shard from position ``start``: LR per optimizer step,
        accumulation, fault injection, mid-epoch checkpoints and progress lines."""
        cfg, adapter, ctx = self.config, self.adapter, self.ctx
        accum, every = cfg.train.grad_accumulation, cfg.checkpoint.every_steps
        samples_per_step = cfg.train.batch_size * ctx.data_size * accum
        steps_per_epoch = self._steps(task)[1]
        indices = sharding.train_shard(len(task.train_data), ctx.data_rank, ctx.data_size, epoch, cfg.train.seed,
                                       cfg.data.shuffle, cfg.data.remainder, start=start)
        batch_list = sharding.batches(indices, cfg.train.batch_size)
        started, seen = time.perf_counter(), 0
        loaded = prefetch(batch_list, lambda idx: task.train_data.get_batch(idx, epoch), cfg.data.prefetch_batches)
        self.watchdog.beat(stats.global_step, "loading the first batch")
        for i, (inputs, targets) in enumerate(loaded):
            self.watchdog.beat(stats.global_step, "running the training step's user code")
            faults.before_step(ctx.rank, stats.global_step)
            # the injected fault poisons the step's loss weight: NaN gradients whatever the inputs' dtype
            poisoned = faults.active("nan", ctx.rank, stats.global_step)
            if i % accum == 0:  # the LR at this position in the data, whatever the world size
                stats.lr = schedule(schedule_step(epoch, start + i * cfg.train.batch_size * ctx.data_size,
                                                  samples_per_step, steps_per_epoch))
                adapter.set_learning_rate(stats.lr)
                window = batch_list[i:i + accum]  # a short last window is weighted by what it holds
                window_samples = sum(len(b) for b in window)
            apply = (i + 1) % accum == 0 or i == len(batch_list) - 1
            self.watchdog.beat(stats.global_step, "waiting in collectives (gradient allreduce)")
            try:
                loss = adapter.train_step(inputs, targets, apply_update=apply,
                                          weight=float("nan") if poisoned else len(targets) / window_samples)
            except NonFiniteGradientError as exc:
                raise TrainingError(
                    f"{exc} at epoch {epoch + 1}, batch {i + 1} (optimizer step {stats.global_step + 1}); stopped "
                    f"without saving it. train.nonfinite=skip drops such updates instead") from None
            stats.global_step += int(apply)
            self.watchdog.beat(stats.global_step, "loading the next batch")
            stats.loss_sum += loss * len(targets)
            stats.samples += len(targets)
            seen += len(targets)
            rate = seen * ctx.data_size / (time.perf_counter() - started)
            self.callbacks.on_step_end(epoch, i, {"loss": loss, "lr": stats.lr, "global_step": stats.global_step,
                                                  "samples": stats.samples, "samples_per_sec": rate,
                                                  "steps": len(batch_list)})
            if cfg.train.log_every and (i + 1) % cfg.train.log_every == 0:
                self.gate.print(f"epoch {epoch + 1}/{cfg.train.epochs} step {i + 1}/{len(batch_list)} "
                                f"loss {loss:.4f} lr {stats.lr:.4g} {rate:.0f} samples/s")
            consumed = start + (i + 1) * cfg.train.batch_size * ctx.data_size
            if apply and every and stats.global_step % every == 0 and i < len(batch_list) - 1:
                self._save_checkpoint(f"step-{stats.global_step:08d}", Position(epoch, consumed, stats.global_step),
                                      stats, None)
                saved_here = True
            else:
                saved_here = False
            # Elastic: commit at every checkpoint too, so a rollback never replays past a written one.
            if apply and cfg.train.elastic and (saved_here or stats.global_step % cfg.train.elastic_commit_every == 0):
                state.position = Position(epoch, consumed, stats.global_step)
                state.carried = stats.totals()
                state.commit()  # distributed: may raise to let Horovod add or remove workers here

    def _save_checkpoint(self, name: str, position: Position, stats: EpochStats,
                         record: dict[str, Any] | None) -> Path | None:
        """Collect every rank's RNG state and partial totals (a collective: all ranks call this at the
        same step), then rank 0 writes the checkpoint atomically. Returns its path on rank 0."""
        cfg, ctx, adapter = self.config, self.ctx, self.adapter
        if record is None:  # an epoch-end checkpoint follows the evaluation, which already averaged them
            adapter.sync_model_buffers()  # distributed: every rank's BatchNorm statistics -> their mean
        mine = {"rng": {**_python_numpy_rng(), "framework": adapter.rng_state()}, **stats.totals()}
        self.watchdog.beat(position.step, "waiting in collectives (checkpoint)")
        rank_states = adapter.allgather_object(mine)
        comm_states = compression_state.gather(adapter)  # error buffers, Q, local-SGD replicas: per rank
        adapter.gather_state()  # a collective: pipeline stages bring their state to rank 0
        if not ctx.is_main:
            return None
        self.watchdog.beat(position.step, "writing a checkpoint")
        if not adapter.state_is_finite():
            raise TrainingError(f"model parameters are not finite at optimizer step {position.step}; "
                                f"refusing to write checkpoint {name}")

        def write(directory: Path) -> None:
            adapter.save_state(directory)
            compression_state.write(directory, comm_states)
            (directory / RANK_STATE_FILE).write_text(json.dumps(rank_states))

        manifest = {"kind": "epoch" if record is not None else "step", "epoch": position.epoch,
                    "consumed": position.consumed, "step": position.step, "recipe": cfg.recipe,
                    "framework": cfg.framework, "world_size": ctx.size, "batch_size": cfg.train.batch_size,
                    "config": to_dict(cfg), "metrics": record, "hvdtrain_version": hvdtrain.__version__,
                    "framework_version": _framework_version(cfg.framework)}
        try:
            return self.manager.save(name, write, manifest).path
        except Exception as exc:  # OSError from us, RuntimeError from torch.save, ... on a full disk
            raise TrainingError(f"could not write checkpoint {name} in {self.manager.directory}: {exc}; "
                                f"nothing partial was left and earlier checkpoints are intact") from None

    def _evaluate(self, task: Any, ctx: DistContext) -> dict[str, float]:
        """Validation metrics over the whole validation set, each sample counted once."""
        data = task.val_data
        self.adapter.sync_model_buffers()  # distributed: evaluate the model rank 0 saves, on every rank
        indices = sharding.eval_shard(len(data), ctx.data_rank, ctx.data_size)
        sums: dict[str, float] = {}
        for inputs, targets in prefetch(sharding.batches(indices, self.config.train.batch_size),
                                        lambda idx: data.get_batch(idx, -1), self.config.data.prefetch_batches):
            self.watchdog.beat(self.watchdog.step, "evaluating")
            for k, v in self.adapter.eval_step(inputs, targets).items():
                sums[k] = sums.get(k, 0.0) + v
        self.watchdog.beat(self.watchdog.step, "waiting in collectives (evaluation metrics)")
        keys = self.adapter.broadcast_object(sorted(sums) if ctx.is_main else None)
        totals = self.adapter.allreduce_sums({k: sums.get(k, 0.0) for k in keys})
        return {"loss": totals["loss_sum"] / max(1.0, totals["count"]), **task.finalize_metrics(totals)}


def train(config: RunConfig, callbacks: list[Callback] | tuple[Callback, ...] = ()) -> RunResult:
    """Run ``config`` in this process (under horovodrun/mpirun, every worker calls this)."""
    get_recipe(config.recipe)
    return Trainer(config, callbacks=callbacks).fit()
