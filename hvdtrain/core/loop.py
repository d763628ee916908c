"""The framework-neutral training loop: epochs, steps, evaluation, metrics.

:class:`Trainer` drives a recipe's :class:`~hvdtrain.core.task.TrainTask` through a
:class:`~hvdtrain.core.adapter.FrameworkAdapter`. Every rank runs the same number of steps per
epoch by construction (equal shards, same batch count), and calls the same collectives in the same
order. The loop only loops; each concern it drives lives in its own module:

* where a run starts: :mod:`hvdtrain.core.resume` (rank 0 plans, every rank follows the plan),
  carried out on every rank by :mod:`hvdtrain.core.startup`;
* when and what to checkpoint: :class:`~hvdtrain.core.saving.CheckpointPolicy`;
* when to stop on a scheduler's signal: :class:`~hvdtrain.core.preemption.PreemptionWatch`;
* when to commit in elastic mode: :func:`hvdtrain.core.elastic.commit_due`;
* when to stop early: :mod:`hvdtrain.core.early_stop`; the validation metrics:
  :mod:`hvdtrain.core.evaluation`; the result, state and totals: :mod:`hvdtrain.core.results`;
* the watchdog's beats, fault injection, progress lines and the recipe's export: callbacks
  (:mod:`hvdtrain.core.visibility`), called around each micro-batch; what the layers above add
  (progress bar, trackers, the hosts' versions) comes in as callbacks and
  :class:`~hvdtrain.core.jobchecks.JobChecks` (:mod:`hvdtrain.trainer` wires the defaults).

Progress is the position in the data, (epoch, samples consumed), which means the same for any
number of workers: the LR schedule is evaluated at it (:func:`~hvdtrain.core.schedule.schedule_step`)
and checkpoints are ordered by it. The optimizer-step counter counts the updates run (a skipped
non-finite one included), carried across resumes and re-forms: step checkpoint names never repeat.
Before every evaluation the model's running statistics (BatchNorm) are averaged over the ranks, so
every rank evaluates, and rank 0 saves, one and the same model; a mid-epoch checkpoint saves their
mean while each rank trains on with its own (kept per rank in the checkpoint,
:mod:`hvdtrain.core.compression_state`): writing a checkpoint changes nothing in training.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hvdtrain.core import (batching, dataset_check, early_stop, elastic, optimizer_policy, reproducible, resume, rules,
                           startup, step_limit, streams)
from hvdtrain.core.adapter import FrameworkAdapter, NonFiniteGradientError, load_adapter
from hvdtrain.core.callbacks import Callback, CallbackList
from hvdtrain.core.checkpoint import CheckpointManager
from hvdtrain.core.config import RunConfig, dump_yaml
from hvdtrain.core.durable import atomic_write_text
from hvdtrain.core.errors import TrainingError
from hvdtrain.core.jobchecks import JobChecks
from hvdtrain.core.redact import redact_values
from hvdtrain.core.evaluation import evaluate
from hvdtrain.core.outputdir import CONFIG_FILE, OutputLock, discard_unfinished
from hvdtrain.core.prefetch import load_batches
from hvdtrain.core.preemption import PreemptionWatch
from hvdtrain.core.rank0 import RankZeroGate
from hvdtrain.core.registry import get_builder, get_recipe
from hvdtrain.core.results import EpochStats, RunResult, TrainingState, done_line, epoch_line
from hvdtrain.core.resume import METRICS_FILE, Position
from hvdtrain.core.saving import CheckpointPolicy
from hvdtrain.core.schedule import build_schedule, schedule_step
from hvdtrain.core.visibility import run_callbacks
from hvdtrain.core.watchdog import StallWatchdog

# Importable from here as before: hvdtrain.reporting (CONFIG_FILE, METRICS_FILE), the CLI and tests
# (TrainingError), hvdtrain/__init__.py and hvdtrain.api (RunResult); the others are used here.
__all__ = ["CONFIG_FILE", "METRICS_FILE", "EpochStats", "RunResult", "Trainer", "TrainingError", "TrainingState",
           "train"]


class Trainer:
    """Runs one recipe on one framework with the given config: the kernel, with the ``callbacks``
    and ``checks`` given and no others (``hvdtrain.Trainer`` adds the default ones)."""

    def __init__(self, config: RunConfig, adapter: FrameworkAdapter | None = None,
                 callbacks: list[Callback] | tuple[Callback, ...] = (), checks: JobChecks | None = None):
        self.config = config
        self.adapter = adapter or load_adapter(config.framework, config.parallel.pipeline_stages)
        self.callbacks = CallbackList(list(callbacks))
        self.checks = checks or JobChecks()

    def fit(self) -> RunResult:
        """Train for ``config.train.epochs`` epochs (from the resume point) and return the history."""
        cfg, adapter = self.config, self.adapter
        builder = get_builder(cfg.recipe, cfg.framework)
        rules.check(cfg)  # the rulebook: what reads only the config, before Horovod starts
        ctx = self.ctx = adapter.init(cfg)
        rules.check_job(cfg, ctx)  # ... and what needs the job
        self.checks.started(cfg, adapter, ctx)  # e.g. MLflow/W&B reachable from rank 0, or every rank stops
        self.lock = OutputLock(Path(cfg.output))  # rank 0 takes it when it plans, holds it to the end
        self.fresh_output = False  # set when the agreed start is a new run into an unused output
        try:
            with StallWatchdog(cfg.train.stall_timeout_sec, ctx.rank) as self.watchdog, \
                    PreemptionWatch(cfg.checkpoint.preempt_signals, ctx.rank, not cfg.train.elastic) as self.preemption:
                return self._fit(builder)
        except BaseException:
            if self.lock.held and self.fresh_output:  # rank 0: a new run that failed before its first epoch
                discard_unfinished(Path(cfg.output))  # leaves the output as unused as it found it
            raise
        finally:
            self.lock.release()

    def _fit(self, builder: Any) -> RunResult:
        cfg, adapter, ctx = self.config, self.adapter, self.ctx
        gate = self.gate = RankZeroGate(ctx.rank)
        output = self.output = Path(cfg.output)
        manager = self.manager = CheckpointManager(output / "checkpoints", cfg.checkpoint.keep_last,
                                                   cfg.checkpoint.best_metric, cfg.checkpoint.best_mode)
        self.checkpoints = CheckpointPolicy(cfg, manager, adapter, self.watchdog)

        is_elastic = cfg.train.elastic
        if not is_elastic:  # elastic: decided in the elastic state's first sync by whoever is rank 0 then
            with self.watchdog.phase("planning the start: rank 0 verifies the checkpoints' checksums"):
                plan = resume.agree(adapter, ctx.is_main, lambda: resume.plan_start(cfg, manager, output, self.lock))
            where = self.checks.workers(adapter)  # e.g. the same versions on every host
            if where:
                gate.print(where)

        self.watchdog.beat(0, "building the recipe's model and data")
        with self.watchdog.phase("building the recipe's model and data (a cold image index or token cache)"), \
                streams.limits(cfg.data.stream_max_gib, cfg.data.stream_max_elements):  # streams read into memory
            task = builder(cfg, ctx)
        rules.check_task(task, cfg)
        if len(task.train_data) < ctx.size:
            raise TrainingError(f"{len(task.train_data)} training samples cannot be shared by {ctx.size} workers")
        if task.val_data is not None and len(task.val_data) == 0:
            raise TrainingError("the validation set is empty (TrainTask.val_data=None trains without validation)")
        if task.val_data is None:  # a run without validation: early stopping and the best checkpoint on train_loss
            early_stop.without_validation(cfg, self.manager, gate)
        # whose LR runs: hvdtrain's schedule, or the task's own optimizer and scheduler (optimizer_policy)
        has_scheduler = getattr(task, "scheduler", None) is not None
        self.lr_policy, notes = optimizer_policy.decide(cfg, adapter.describe_optimizer(task), has_scheduler)
        optimizer_policy.check_task_schedule(cfg, self.lr_policy, has_scheduler)
        for note in [*notes, *batching.notes(cfg.train, ctx.data_size)]:  # e.g. train.batch_size from the global batch
            gate.print(note)
        adapter.task_lr = self.lr_policy.task
        self.watchdog.beat(0, "preparing the model and optimizer")
        adapter.prepare(task, batching.as_run(cfg, ctx.data_size))  # a fixed global batch: its accumulation
        self.hooks = run_callbacks(cfg, self.watchdog, task.export, output, self.callbacks)
        if is_elastic:
            # Before the elastic loop every step is local: a worker that joins later runs this prelude
            # while the others are already inside the loop. Where to start is agreed in the elastic
            # state's first sync, and rank 0's position and weights reach the others there.
            result = elastic.run_elastic(self, lambda st: self._run_epochs(task, st), TrainingState(Position(), []))
        else:
            state = self.start(plan)
            self.announce_start()
            result = self._run_epochs(task, state)
        self.hooks.on_train_end(result)  # the recipe's export first
        self.gate.print(done_line(cfg, self.ctx.size, result))
        return result

    def start(self, plan: dict[str, Any], collective: bool = True) -> TrainingState:
        """Carry out the agreed ``plan`` on every rank (:func:`hvdtrain.core.startup.start`)."""
        self.fresh_output = bool(plan.get("fresh"))
        return startup.start(plan, self.adapter, self.ctx, self.gate, self.output, self.watchdog,
                             self.config.train.seed, collective)

    def announce_start(self) -> None:
        """Rank 0, once every rank has agreed on the start: ``config.yaml``, and its pid and host
        in the output's lock file (what a run refused by the lock names)."""
        if self.ctx.is_main:
            ran = optimizer_policy.ran_config(self.config, getattr(self, "lr_policy", None))  # what ran
            # secrets in URIs: never written
            atomic_write_text(self.output / CONFIG_FILE, dump_yaml(redact_values(ran)))
            self.lock.announce()

    def _reseed(self, position: Position) -> None:
        """This rank's own framework random stream at ``position`` (:func:`hvdtrain.core.startup.reseed`)."""
        startup.reseed(self.adapter, self.config.train.seed, self.ctx.rank, position)

    def _steps(self, task: Any) -> tuple[int, int]:
        """Micro-batches and optimizer steps per epoch at the current world size."""
        return batching.plan_for(self.config.train, self.ctx.data_size).steps(len(task.train_data),
                                                                             self.config.data.remainder)

    def _run_epochs(self, task: Any, state: TrainingState) -> RunResult:
        """The epochs from ``state.position`` on. In elastic mode Horovod calls this again after a
        worker joins or leaves, with the state of the last commit and a new world size."""
        cfg, adapter, ctx, gate = self.config, self.adapter, self.ctx, self.gate
        dataset_check.check_same_data(adapter, task)  # every rank (re-formed ones too) trains the same data
        micro_steps, opt_steps = self._steps(task)
        policy = getattr(self, "lr_policy", None) or optimizer_policy.LRPolicy("hvdtrain", None, cfg.optim)
        schedule = None if policy.task else build_schedule(
            policy.optim or cfg.optim, ctx.data_size, opt_steps, cfg.train.epochs,
            batching.plan_for(cfg.train, ctx.data_size).accumulation, cfg.train.max_steps)
        position = state.position
        val_samples = len(task.val_data) if task.val_data is not None else "no"
        gate.print(f"hvdtrain: {cfg.recipe}/{cfg.framework} on {ctx.size} worker(s): {len(task.train_data)} train / "
                   f"{val_samples} val samples, {micro_steps} steps/epoch of "
                   f"{batching.micro_batch(cfg.train, ctx.data_size)} per worker, " + (policy.describe() if schedule is None else f"peak LR {schedule.peak_lr:g}"))
        self.hooks.on_train_begin(ctx, {"config": cfg, "output": self.output, "start_epoch": position.epoch,
                                        "steps_per_epoch": micro_steps, "world_size": ctx.size,
                                        "config_ran": optimizer_policy.ran_config(cfg, policy)})
        global_step = position.step
        stopper = early_stop.continue_from(cfg, state.history, gate)  # None when off
        end = step_limit.end_epoch(cfg, position, stopper, gate)  # stopped early, max_steps reached, or train.epochs
        for epoch in range(position.epoch, end):
            started = time.perf_counter()
            resumed_here = epoch == position.epoch and position.consumed > 0
            stats = EpochStats(global_step=global_step)
            if resumed_here and state.carried:
                stats.loss_sum, stats.samples = state.carried["loss_sum"], state.carried["samples"]
            skipped_before = adapter.skipped_updates
            adapter.begin_epoch(epoch)  # fine-tuning: the backbone frozen or not in this epoch
            after = self._train_epoch(task, epoch, schedule, stats, position.consumed if resumed_here else 0, state)
            global_step = stats.global_step
            totals = adapter.allreduce_sums({"loss_sum": stats.loss_sum, "samples": float(stats.samples),
                                             "time": time.perf_counter() - started,
                                             "skipped": float(adapter.skipped_updates - skipped_before)})
            adapter.sync_replicas()  # local SGD: evaluate (and checkpoint) the averaged model
            if task.val_data is not None:
                val = evaluate(task, adapter, ctx, cfg, self.watchdog)
            else:  # no validation: every rank still holds the model rank 0 saves
                adapter.sync_model_buffers()  # distributed
                val = {}
            record = {
                "epoch": epoch + 1,
                "train_loss": totals["loss_sum"] / max(1.0, totals["samples"]),
                **{f"val_{k}": v for k, v in val.items()},
                "samples_per_sec": totals["samples"] / max(1e-9, totals["time"] / ctx.data_size),
                "epoch_time_sec": time.perf_counter() - started,
                "lr": stats.lr,
                "world_size": ctx.size,
                "step": stats.global_step,  # elastic: and the world size of each range of updates, if several
                **batching.world_sizes_field(getattr(self, "world_sizes", None), state.history, stats.global_step),
            }
            if totals["skipped"]:
                record["skipped_updates"] = int(totals["skipped"] / ctx.size)
            # every rank holds the same record (allreduced values): every rank decides alike, no collective
            stop = (stopper.update(record) if stopper else False) or step_limit.reached(cfg, stats.global_step)
            state.history.append(record)
            saved = self.checkpoints.at_epoch_end(ctx, after, record, stats.totals())  # early stop: in its manifest
            state.last_checkpoint = saved or state.last_checkpoint
            gate.append_jsonl(self.output / METRICS_FILE, record)
            self.hooks.on_epoch_end(epoch, record)
            gate.print(epoch_line(record))
            self.preemption.at_epoch_end(self.checkpoints, ctx, after, more_epochs=epoch + 1 < end and not stop)
            state.position, state.carried = after, None
            state.commit()
            if stop:
                gate.print(step_limit.stop_line(cfg, epoch, stats.global_step, stopper))
                break
        return RunResult(self.output, state.history, state.last_checkpoint, ctx.size)

    def _train_epoch(self, task: Any, epoch: int, schedule: Any, stats: EpochStats, start: int,
                     state: TrainingState) -> Position:
        """This rank's shard from ``start``, cut at ``train.max_steps``: per micro-batch the LR at its position
        (``schedule``; None: the task's own, read back, its scheduler stepped per update), the step, the callbacks,
        the checkpoint and elastic-commit cadences. Returns the position after it (inside the epoch when cut)."""
        cfg, adapter, ctx = self.config, self.adapter, self.ctx
        plan = batching.plan_for(cfg.train, ctx.data_size)  # per worker, or a fixed global batch dealt
        accum, batch_size, samples_per_step = plan.accumulation, plan.micro_batch, plan.samples_per_update
        steps_per_epoch = self._steps(task)[1]
        batch_list = plan.epoch_batches(len(task.train_data), ctx.data_rank, epoch, cfg.train.seed, cfg.data.shuffle,
                                        cfg.data.remainder, start=start)
        batch_list, cut = step_limit.cut(cfg, batch_list, stats.global_step, accum)
        last = len(batch_list) - 1
        started, seen = time.perf_counter(), 0
        loaded = load_batches(task.train_data, batch_list, epoch, cfg, ctx,  # in data workers or a thread
                              convert=adapter.convert_batch)
        self.watchdog.beat(stats.global_step, "loading the first batch")
        for i, (inputs, targets) in enumerate(loaded):
            if i % accum == 0:
                if schedule is not None:  # the LR at this position in the data, whatever the world size
                    stats.lr = schedule(schedule_step(epoch, start + i * batch_size * ctx.data_size,
                                                      samples_per_step, steps_per_epoch))
                    adapter.set_learning_rate(stats.lr)
                window_samples = sum(len(b) for b in batch_list[i:i + accum])  # a short last window: what it holds
            apply = (i + 1) % accum == 0 or i == last
            step = {"global_step": stats.global_step, "weight": plan.weight(len(targets), window_samples)}
            self.hooks.on_step_begin(epoch, i, step)  # watchdog, injected faults (NaN: in the weight)
            if schedule is None and i % accum == 0:
                stats.lr = adapter.learning_rate()  # the task's own LR, as this update uses it
            reproducible.before_micro_batch(adapter, cfg, plan, ctx.data_rank, stats.global_step, i)  # bitwise mode
            try:
                loss = adapter.train_step(inputs, targets, apply_update=apply, weight=step["weight"])
            except NonFiniteGradientError as exc:
                raise TrainingError(
                    f"{exc} at epoch {epoch + 1}, batch {i + 1} (optimizer step {stats.global_step + 1 - exc.updates_ago}); stopped "
                    f"without saving it. train.nonfinite=skip drops such updates instead") from None
            stats.global_step += int(apply)
            if apply and schedule is None:
                adapter.step_scheduler()  # the task's own scheduler: once per update
            stats.loss_sum += reproducible.loss_term(cfg, loss, len(targets))  # bitwise mode: in float64
            stats.samples += len(targets)
            seen += len(targets)
            rate = seen * ctx.data_size / (time.perf_counter() - started)
            self.hooks.on_step_end(epoch, i, {"loss": loss, "lr": stats.lr, "global_step": stats.global_step,
                                              "samples": stats.samples, "samples_per_sec": rate,
                                              "steps": len(batch_list)})
            position = Position(epoch, start + (i + 1) * batch_size * ctx.data_size, stats.global_step)
            saved = self.checkpoints.maybe_save(ctx, position, stats, apply, last_in_epoch=i == last)
            self.preemption.maybe_stop(self.checkpoints, ctx, position, stats, apply, i == last, saved)
            if elastic.commit_due(cfg, stats.global_step, apply, checkpointed=saved):
                state.position, state.carried = position, stats.totals()
                state.commit()  # distributed: may raise to let Horovod add or remove workers here
        return position if cut else Position(epoch + 1, 0, stats.global_step)


def train(config: RunConfig, callbacks: list[Callback] | tuple[Callback, ...] = (),
          checks: JobChecks | None = None) -> RunResult:
    """Run ``config`` in this process with these callbacks and checks only (``hvdtrain.train``
    adds the default ones; under horovodrun/mpirun, every worker calls it)."""
    get_recipe(config.recipe)
    return Trainer(config, callbacks=callbacks, checks=checks).fit()
