"""hvdtrain inside your own PyTorch training loop: :func:`prepare`.

``prepare(model, optimizer, data)`` does what a Horovod script does by hand (``hvd.init()``,
``broadcast_parameters``, ``broadcast_optimizer_state``, ``DistributedOptimizer``,
``DistributedSampler``) with the Trainer's own pieces, so the loop gets what the Trainer gives:

* Horovod started through the launch layer (:func:`hvdtrain.launch.start`): under ``horovodrun``,
  ``mpirun``, ``srun`` or alone (one process);
* the gradient exchange the config plans (:func:`hvdtrain.core.exchange_plan.plan_exchange`, built by
  :mod:`hvdtrain.torch.exchanges` inside :class:`~hvdtrain.torch.adapter.TorchAdapter`) exactly as
  for the Trainer (allreduce, fp16, PowerSGD, top-k, local SGD, flat buffers, overlap, ZeRO-1/2),
  with the same keys and the rulebook's refusals (:mod:`hvdtrain.core.rules`);
* model, optimizer (and scheduler) state broadcast from rank 0, each rank's random stream seeded
  from (``train.seed``, rank, position) as the Trainer seeds it;
* the training data dealt by (seed, epoch, samples consumed)
  (:class:`~hvdtrain.torch.positioned.PositionedLoader`);
* :meth:`OwnLoop.save` / :meth:`OwnLoop.load`: the Trainer's checkpoints (``OUTPUT/checkpoints/``,
  manifest, ``config.yaml``, ``metrics.jsonl``), which ``hvdtrain report`` reads, and an exact
  resume (bit for bit at the same world size; at the next sample at another).

What stays Trainer-only is refused by name (:data:`hvdtrain.core.own_loop.TRAINER_ONLY`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError

from hvdtrain.core import own_loop, resume, rules, script_errors, startup
from hvdtrain.core.checkpoint import MANIFEST, CheckpointInfo, CheckpointManager
from hvdtrain.core.config import ConfigError, RunConfig, dump_yaml, load_config, parse_override
from hvdtrain.core.durable import atomic_write_text
from hvdtrain.core.errors import TrainingError, type_name
from hvdtrain.core.optimizer_policy import LRPolicy, ran_config
from hvdtrain.core.outputdir import CONFIG_FILE
from hvdtrain.core.preemption import EXIT_PREEMPTED, PreemptionWatch, stop_message
from hvdtrain.core.rank0 import RankZeroGate
from hvdtrain.core.redact import redact_values
from hvdtrain.core.resume import METRICS_FILE, Position
from hvdtrain.core.saving import CheckpointPolicy
from hvdtrain.core.visibility import ConfigNotes
from hvdtrain.core.watchdog import STALL_EXIT_CODE, StallWatchdog
from hvdtrain.launch import detect
from hvdtrain.torch import waiting
from hvdtrain.torch.adapter import MODEL_FILE, OPTIMIZER_FILE, TorchAdapter
from hvdtrain.torch.positioned import PositionedLoader, loader_facts
from hvdtrain.torch.weights import load_weights_only

CHECKPOINTS = "checkpoints"  # OUTPUT/checkpoints/, as the Trainer writes them
# the collectives of a prepared run besides optimizer.step(): before each, the ranks agree which one they call
CALLS = ("run.save", "run.load", "run.mean", "run.sum")
WAIT_NOTE_SEC = 60.0  # without train.stall_timeout_sec: a rank waiting this long for the others says so (once)


def prepare(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any = None, scheduler: Any = None, *,
            config: RunConfig | str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
            save_on_signal: str | Path | None = None, **keys: Any) -> "OwnLoop":
    """Start Horovod (if needed) and return an :class:`OwnLoop` holding ``model`` (moved to this
    rank's device), the distributed ``optimizer`` (call ``step()`` on it, not on yours),
    ``data`` as a :class:`~hvdtrain.torch.positioned.PositionedLoader` and ``scheduler``.

    ``data``: a map-style ``Dataset`` (batched by ``train.batch_size`` per worker, shuffled per
    ``data.shuffle``) or a ``DataLoader`` over one with default sampling (its ``batch_size``,
    ``shuffle``, ``drop_last``, workers and ``collate_fn`` kept). ``scheduler``: a torch LR
    scheduler of ``optimizer`` you step yourself; it is broadcast, saved and loaded with the rest.

    The config: hvdtrain's keys, from ``config`` (a :class:`~hvdtrain.core.config.RunConfig` or a
    YAML file), then ``keys`` (dotted names with ``__`` for dots: ``comm__compression="powersgd"``),
    then ``overrides`` (``["parallel.shard_optimizer=gradients"]``, as on the command line). A
    combination the rulebook refuses, or a Trainer-only key, raises
    :class:`~hvdtrain.core.config.ConfigError` with the CLI's one line. Every rank must call it.

    ``save_on_signal``: an output folder (the one your loop saves into) to stop at a checkpoint on
    SIGINT (Ctrl-C) and the signals of ``checkpoint.preempt_signals`` (SIGUSR1, SIGTERM), as the
    Trainer stops (:mod:`hvdtrain.core.preemption`): the signal is recorded, the update under way
    finishes, and when the next ``optimizer.step()`` returns every rank saves there (as
    :meth:`OwnLoop.save`), rank 0 prints one line naming the signal and the checkpoint, and the
    process exits :data:`~hvdtrain.core.preemption.EXIT_PREEMPTED` (75); ``run.load`` of that folder
    continues. A second Ctrl-C stops at once. None (the default): no handler, signals act as without hvdtrain.

    hvdtrain's refusals that your script does not catch (from ``prepare``, ``save``, ``load``: a
    ``ConfigError``, ``CheckpointError`` or ``TrainingError``, raised alike on every rank) end the
    job as the ``hvdtrain`` command does: one line ``hvdtrain: error: ...`` on rank 0, no
    traceback, exit status 2 (a bad value) or 1 (:func:`hvdtrain.core.script_errors.install`).
    """
    script_errors.install(_rank)
    if isinstance(optimizer, DistributedStep) or isinstance(data, PositionedLoader):
        what = "optimizer" if isinstance(optimizer, DistributedStep) else "data"
        raise ConfigError(f"{what}: prepare() was given the run.{what} an earlier prepare() returned; call prepare() "
                          f"once, with your own model, optimizer and data, and use what it returns")
    given = {k.replace("__", ".") for k, v in keys.items() if v is not None} | \
        {parse_override(text)[0] for text in overrides}
    cfg = _config(config, overrides, keys)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"optimizer: {type_name(optimizer)} is not a torch.optim.Optimizer")
    stray = sorted(k for k in given if k.startswith("optim.") and k != "optim.grad_clip_norm")
    if stray:
        raise ConfigError(f"{stray[0]}: your optimizer and scheduler set the LR and its schedule in your loop; "
                          f"of the optim.* keys prepare() takes only optim.grad_clip_norm")
    loader_parts = loader_facts(data) if data is not None else None
    if loader_parts is not None:
        _take_loader_settings(cfg, loader_parts, given)
    problem = own_loop.refusal(cfg) or rules.refusal(cfg)
    if problem:
        raise ConfigError(problem)
    return OwnLoop(model, optimizer, scheduler, cfg, loader_parts, save_on_signal)


def _rank() -> int:
    """This process's rank: Horovod's once it runs, before that the launcher's."""
    return hvd.rank() if hvd.is_initialized() else detect.rank()


def _config(config: Any, overrides: Any, keys: dict[str, Any]) -> RunConfig:
    """The run's config: given, or resolved from a file, ``keys`` and ``overrides`` (recipe ``own-loop``)."""
    if isinstance(config, RunConfig):
        if overrides or keys:
            raise ConfigError("prepare(config=RunConfig, ...): pass either a RunConfig or keys and overrides, not both")
        cfg = config
    else:
        cfg = load_config(None, file=config, overrides=overrides, **{"recipe": own_loop.RECIPE, **keys})
    if cfg.framework != "torch":
        raise ConfigError(f"framework={cfg.framework!r}: hvdtrain.torch.prepare runs PyTorch; use framework=torch")
    return cfg


def _take_loader_settings(cfg: RunConfig, parts: tuple, given: set[str]) -> None:
    """A DataLoader's batch size and shuffle are the run's (recorded in the config); a key given
    that contradicts them is refused naming both."""
    _, batch_size, shuffle, _, _ = parts
    for key, value, section, name in (("train.batch_size", batch_size, cfg.train, "batch_size"),
                                      ("data.shuffle", shuffle, cfg.data, "shuffle")):
        if value is None:
            continue
        if key in given and getattr(section, name) != value:
            raise ConfigError(f"{key}={getattr(section, name)!r} contradicts the DataLoader's "
                              f"{name}={value!r}; set one of them")
        setattr(section, name, value)


class DistributedStep:
    """The optimizer a prepared loop steps: ``step()`` exchanges the gradients (the planned
    exchange, a collective: every rank calls it), clips them (``optim.grad_clip_norm``), checks them
    (``train.nonfinite``), applies your optimizer's update and leaves the gradients zeroed.
    Everything else (``param_groups``, ``state_dict``, ...) is the optimizer that runs: yours, or
    the exchange's wrapper of it (``hvd.DistributedOptimizer``, ZeRO's sharded optimizer)."""

    def __init__(self, adapter: TorchAdapter, loop: "OwnLoop") -> None:
        self._adapter, self._loop = adapter, loop

    def step(self, closure: Any = None) -> None:
        """One update from the gradients of the backward passes since the last one."""
        if closure is not None:
            raise ValueError("optimizer.step(closure): a closure re-evaluates the loss, which a distributed "
                             "update cannot; call loss.backward() then optimizer.step()")
        loop = self._loop
        if loop.data is not None:
            loop.data.position.count()  # the batches handed out so far are this update's: consumed
        loop.watchdog.beat(loop.updates, "waiting in collectives (optimizer.step's gradient exchange)")
        try:
            self._adapter._apply_update()  # distributed: the exchange, the checks, the update, the zeroing
        except HorovodInternalError as exc:  # another rank ended (its own error said why): one line, not a traceback
            print(f"hvdtrain: rank {loop.rank}: another rank stopped while this one waited in optimizer.step's "
                  f"gradient exchange at update {loop.updates + 1} ({' '.join(str(exc).split())[:120]}...)",
                  file=sys.stderr, flush=True)
            os._exit(1)
        loop.updates += 1
        loop.watchdog.beat(loop.updates, "running your loop (between hvdtrain's calls)")
        self._attach()
        loop._stop_if_signalled()  # save_on_signal: the safe point after an update

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (``step()`` already leaves them zeroed: not needed after it)."""
        self._adapter.optimizer.zero_grad(set_to_none=set_to_none)
        self._attach()

    def _attach(self) -> None:
        self._adapter.optimizer_state.before_backward()  # ZeRO: the flat buffers backward fills

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter.optimizer, name)

    def __repr__(self) -> str:
        return f"DistributedStep({self._adapter.optimizer!r}, exchange={type(self._adapter.exchange).__name__})"


class OwnLoop:
    """What :func:`prepare` returns: ``model``, ``optimizer`` (a :class:`DistributedStep`), ``data``
    (a :class:`~hvdtrain.torch.positioned.PositionedLoader`, or None), ``scheduler``, ``config``,
    ``device``; where this process sits (``rank``, ``size``, ``local_rank``, ``is_main``); the
    position (``epoch``, ``updates``); and :meth:`save`, :meth:`load`, :meth:`mean`, :meth:`sum`,
    :meth:`print`.

    With ``train.stall_timeout_sec`` set, the Trainer's stall watchdog
    (:class:`~hvdtrain.core.watchdog.StallWatchdog`) ends the job with one line per rank when no
    step, save, load, mean or sum comes for that long. Before each of :data:`CALLS` the ranks agree,
    in one small allgather, that they all call the same one at the same update: a call made on
    some ranks only (``if rank == 0: run.save(...)``) ends the job with one line naming it (after
    ``train.stall_timeout_sec``; without it a rank says once, after a minute, what it waits for), a
    different call on each rank is a :class:`~hvdtrain.core.errors.TrainingError` naming both."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, config: RunConfig,
                 loader_parts: tuple | None, save_on_signal: str | Path | None = None) -> None:
        self.config, self.scheduler, self.updates = config, scheduler, 0
        self._saved: tuple = (None, None, None)  # (output, position, path) of the last save
        self.adapter = adapter = TorchAdapter()
        self.ctx = ctx = adapter.init(config)  # launch.start: the launcher's environment, hvd.init()
        rules.check_job(config, ctx)  # the job's rules (world size, MPI, GPU), on every rank alike
        ConfigNotes(config).on_train_begin(ctx, {})  # what the config's loader rewrote, on rank 0
        task = SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler)
        self.facts = adapter.describe_optimizer(task)  # a scheduler of another optimizer is refused
        adapter.task_lr = True  # your optimizer's LR runs; hvdtrain's schedule is off
        adapter.prepare(task, config)  # the planned exchange around your optimizer
        self.model, self.device = adapter.model, adapter.device
        self.gate = RankZeroGate(ctx.rank)
        self.watchdog = StallWatchdog(config.train.stall_timeout_sec, ctx.rank)
        self.data: PositionedLoader | None = None
        if loader_parts is not None:
            dataset, _, _, drop_last, settings = loader_parts
            position = own_loop.DataPosition(len(dataset), config.train.batch_size, ctx.rank, ctx.size,
                                             config.train.seed, config.data.shuffle, config.data.remainder, drop_last)
            self.data = PositionedLoader(dataset, position, settings)
        self.optimizer = DistributedStep(adapter, self)
        # broadcast model, optimizer and scheduler state from rank 0; seed each rank's random stream
        startup.start({"checkpoint": None}, adapter, ctx, self.gate, Path("."), self.watchdog, config.train.seed)
        self.optimizer._attach()
        self.watchdog.__enter__()  # a daemon thread while the process lives (nothing with the timeout unset)
        self.watchdog.beat(0, "running your loop (between hvdtrain's calls)")
        self._stop_into = Path(save_on_signal) if save_on_signal is not None else None
        self.preemption: PreemptionWatch | None = None
        if self._stop_into is not None:  # recorded from now on; acted on after an update (_stop_if_signalled)
            names = own_loop.signals_to_save_on(config.checkpoint.preempt_signals)
            self.preemption = PreemptionWatch(names, ctx.rank).__enter__()  # handlers kept while the process lives

    def _stop_if_signalled(self) -> None:
        """After an update, with ``save_on_signal``: when any rank got a watched signal (the ranks
        agree as the Trainer's do, about once a second: a collective when due), every rank saves
        into the ``save_on_signal`` folder, rank 0 prints the stop line, and the process exits
        :data:`~hvdtrain.core.preemption.EXIT_PREEMPTED`."""
        if self.preemption is None:
            return
        signals = self.preemption.agreed(self.adapter, self.size)  # distributed (when due)
        if not signals:
            return
        saved = self.save(self._stop_into)  # distributed
        self.adapter.barrier()  # no rank exits before rank 0 has written it (horovodrun ends the others)
        position = self.position
        message = stop_message(signals, position.step, position.epoch - (position.consumed == 0 < position.epoch),
                               str(saved) if saved else None, f"run.load({str(self._stop_into)!r}) continues from there")
        self.gate.print(f"hvdtrain: {message}")
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(EXIT_PREEMPTED)

    # -- where this process sits ------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's Horovod rank."""
        return self.ctx.rank

    @property
    def size(self) -> int:
        """The number of workers."""
        return self.ctx.size

    @property
    def local_rank(self) -> int:
        """This process's rank on its host."""
        return self.ctx.local_rank

    @property
    def is_main(self) -> bool:
        """True on rank 0: the rank that prints and writes files."""
        return self.ctx.is_main

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only (flushed)."""
        self.gate.print(*args, **kwargs)

    # -- metrics ------------------------------------------------------------------------------
    def mean(self, values: Any) -> Any:
        """The mean over all workers of a number, a tensor, or a list or dict of them (a collective:
        every rank calls it); a number or one-element tensor comes back as a float, a larger tensor
        as a float64 tensor on the CPU."""
        return self._reduce(values, hvd.Average, "mean")

    def sum(self, values: Any) -> Any:
        """The sum over all workers, as :meth:`mean` (counts, correct predictions)."""
        return self._reduce(values, hvd.Sum, "sum")

    def _reduce(self, values: Any, op: Any, what: str) -> Any:
        self._agree(f"run.{what}")
        return self._reduced(values, op, what)

    def _reduced(self, values: Any, op: Any, what: str) -> Any:
        if isinstance(values, dict):
            keys = list(values)
            reduced = self._reduced([values[k] for k in keys], op, what)
            return dict(zip(keys, reduced))
        many = isinstance(values, (list, tuple))
        items = list(values) if many else [values]
        tensors = [torch.as_tensor(v).detach().to("cpu", torch.float64) for v in items]
        out = hvd.grouped_allreduce(tensors, op=op, name=f"hvdtrain.own_loop.{what}")  # distributed
        out = [float(o) if o.numel() == 1 else o for o in out]
        self.watchdog.beat(self.updates, "running your loop (between hvdtrain's calls)")
        return out if many else out[0]

    def _agree(self, call: str) -> None:
        """Before collective ``call`` (one of :data:`CALLS`): every rank calls it at this update, or
        the job ends with one line saying so (see the class docstring)."""
        if self.size == 1:
            return
        mine = torch.tensor([[CALLS.index(call), self.updates]], dtype=torch.int64)
        self.watchdog.beat(self.updates, f"waiting in collectives ({call}: every rank calls it)")
        limit, started, noted = self.config.train.stall_timeout_sec, time.monotonic(), []

        def still_waiting() -> bool:  # between polls: past the limit ends the job; without one, a note once
            waited = time.monotonic() - started
            if limit and waited > limit:
                self._left_alone(call, f"{limit:g}s (train.stall_timeout_sec={limit:g})")
            if not limit and waited > WAIT_NOTE_SEC and not noted:
                noted.append(waited)
                print(f"hvdtrain: rank {self.rank} has waited {waited:.0f}s in {call} at update "
                      f"{self.updates} for the other ranks ({call} is a collective: every rank calls it; "
                      f"train.stall_timeout_sec=N ends a job that hangs)", file=sys.stderr, flush=True)
            return True

        with self.watchdog.phase(f"{call}: the ranks agree that every one calls it"):  # its own limit, above
            try:
                handle = hvd.allgather_async(mine, name="hvdtrain.own_loop.call")  # distributed
                waiting.wait_until(lambda: hvd.poll(handle) or not still_waiting())  # the backoff of every wait
                seen = hvd.synchronize(handle).tolist()
            except Exception as exc:  # Horovod shut down under us: a rank ended without calling it
                self._left_alone(call, f"until Horovod stopped ({' '.join(str(exc).split())[:200]})")
        if any(row != seen[0] for row in seen):
            calls = ", ".join(f"rank {r} called {CALLS[c]} at update {u}" for r, (c, u) in enumerate(seen))
            raise TrainingError(f"{', '.join(sorted({CALLS[c] for c, _ in seen}))}: every rank must call the same "
                                f"collective at the same update, but {calls}")

    def _left_alone(self, call: str, how_long: str) -> None:
        """This rank called ``call`` and the others did not come: one line, and the process ends
        (its collective is still pending: nothing else can run), so the launcher ends the job."""
        others = f"rank {1 - self.rank} did not call it" if self.size == 2 else \
            f"not every one of the {self.size} ranks called it"
        print(f"hvdtrain: error: rank {self.rank} called {call} at update {self.updates} and waited {how_long}: "
              f"{others}; {call} is a collective: call it on every rank at the same point (rank 0 writes the "
              f"files), not under `if rank == 0:`", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(STALL_EXIT_CODE)

    # -- position and checkpoints -------------------------------------------------------------
    @property
    def position(self) -> Position:
        """Epochs completed, samples of the current epoch consumed, updates taken."""
        if self.data is None:
            return Position(0, 0, self.updates)
        return self.data.position.position(self.updates)

    @property
    def epoch(self) -> int:
        """Epochs completed: after :meth:`load`, the epoch to continue with."""
        return self.position.epoch

    def epochs(self, total: int) -> range:
        """The epochs still to train of ``total``: ``for epoch in run.epochs(3): for batch in run.data: ...``."""
        return range(self.epoch, total)

    def _manager(self, output: Path, manifest: dict[str, Any] | None = None) -> CheckpointManager:
        ck = self.config.checkpoint
        manager = CheckpointManager(output / CHECKPOINTS, ck.keep_last, ck.best_metric, ck.best_mode)
        manager.required, manager.framework = self.adapter.checkpoint_files, "torch"
        manager.extra = {"data": self.data.facts()} if self.data is not None else {}
        manager.extra.update(manifest or {})
        return manager

    def save(self, path: str | Path, metrics: dict[str, Any] | None = None) -> Path | None:
        """Checkpoint the run into the output folder ``path`` (a collective: every rank calls it, at
        the same update): ``path/checkpoints/epoch-NNNN`` at an epoch's end, ``step-NNNNNNNN``
        inside one, written by rank 0 atomically as the Trainer writes them (model, optimizer,
        scheduler, every rank's random state and exchange state, the position, and the data's
        length), then pruned to ``checkpoint.keep_last``. ``metrics`` (e.g. the epoch's mean loss
        and validation accuracy) become a row of ``path/metrics.jsonl`` and the checkpoint's
        record, which ``hvdtrain report`` plots. A second call at the same position writes no
        second checkpoint (only the metrics row). Returns the checkpoint's folder on rank 0, else None."""
        self._agree("run.save")
        output, position = Path(path), self.position
        at_epoch_end = self.data is not None and position.consumed == 0 and position.epoch > 0
        name = f"epoch-{position.epoch:04d}" if at_epoch_end else f"step-{position.step:08d}"
        record = None
        if metrics is not None or at_epoch_end:
            record = {"epoch": position.epoch, "step": position.step,
                      "lr": float(self.optimizer.param_groups[0]["lr"]), **(metrics or {})}
        if at_epoch_end:
            self.adapter.sync_model_buffers()  # distributed: the epoch ends with the ranks' mean statistics
        if self.is_main:
            output.mkdir(parents=True, exist_ok=True)
            if not (output / CONFIG_FILE).exists():
                ran = ran_config(self.config, LRPolicy("task", self.facts))
                atomic_write_text(output / CONFIG_FILE, dump_yaml(redact_values(ran)))
        if self._saved[:2] == (output.resolve(), position):  # saved here already (a step save at the epoch's end)
            saved = self._saved[2]
        else:
            # an epoch's end without metrics: no metrics.jsonl row, so the manifest holds no record a resume
            # would take for the row the file lost
            policy = CheckpointPolicy(self.config, self._manager(output, {} if metrics else {"metrics": None}),
                                      self.adapter, self.watchdog)
            totals = {"loss_sum": 0.0, "samples": 0}
            saved = policy.save(self.ctx, name, position, totals, record if at_epoch_end else None)
            self._saved = (output.resolve(), position, saved)
        if self.is_main and metrics is not None:
            self.gate.append_jsonl(output / METRICS_FILE, record)
        self.watchdog.beat(self.updates, "running your loop (between hvdtrain's calls)")
        return saved

    def load(self, path: str | Path) -> bool:
        """Continue from a checkpoint (a collective): ``path`` is an output folder (its newest
        checkpoint whose files match their checksums; its ``metrics.jsonl`` is cut back to that
        checkpoint) or one checkpoint folder (no file is written). Model, optimizer, scheduler,
        exchange state and position are restored; at the world size that wrote it every rank's
        random state too (bit for bit the run that was not stopped), at another the rest of the
        epoch is dealt anew and the random streams reseeded. Returns False, changing nothing, when
        the folder holds no checkpoint yet (a first start). Refused naming the checkpoint, before
        anything is loaded: a checkpoint of another run (another batch size, seed, ... : the key),
        of another model (the first keys that differ), or at a position past this data's end. An
        optimizer setting yours has and the checkpoint's has not (another ``lr``) is named in a
        warning: the checkpoint's value runs."""
        self._agree("run.load")
        path = Path(path)
        plan = resume.agree(self.adapter, self.is_main, lambda: self._plan(path))  # distributed
        if not plan.get("checkpoint"):
            return False
        yours = _hyperparameters(self.optimizer)
        output = Path(plan["output"]) if plan.get("output") else None
        state = startup.start(plan, self.adapter, self.ctx, self.gate, output, self.watchdog, self.config.train.seed)
        self.updates = state.position.step
        if self.data is not None:
            self.data.position.resume_at(state.position)
        self.optimizer._attach()
        changed = [f"{key}={yours[key]!r} (the checkpoint's: {value!r})"
                   for key, value in _hyperparameters(self.optimizer).items() if yours.get(key, value) != value]
        if changed:
            self.gate.warn(f"your optimizer's {', '.join(changed)} differs from checkpoint {plan['checkpoint']}; "
                           f"the checkpoint's value runs (load_state_dict restores it): set it after run.load "
                           f"to change it")
        self.watchdog.beat(self.updates, "running your loop (between hvdtrain's calls)")
        return True

    def _plan(self, path: Path) -> dict[str, Any]:
        """Rank 0: the checkpoint to load and what goes with it, or the error every rank raises."""
        try:
            notes: list[str] = []
            output: Path | None
            if (path / MANIFEST).is_file():
                info = CheckpointManager.open(path, self.adapter.checkpoint_files)
                output = None  # one checkpoint, maybe of another run's output: nothing of it is rewritten
            else:
                info, output = self._manager(path).latest(notes), path
            if info is None:
                return {"checkpoint": None}
            problem = resume.incompatibility(info, self.config, "another output folder") or \
                self._other_model(info) or self._past_data(info, notes)
            if problem:
                return {"error": problem}
            history = resume.read_history(output, info, notes) if output is not None else []
            return {"checkpoint": str(info.path), "output": str(output) if output is not None else None,
                    "manifest": info.manifest, "history": history, "notes": notes,
                    "epochs": resume.OWN_LOOP_EPOCHS}  # the resume message counts epochs as run.epoch does
        except Exception as exc:  # every rank must hear about it, or the others hang in the broadcast
            return {"error": str(exc)}

    def _other_model(self, info: CheckpointInfo) -> str | None:
        """Why checkpoint ``info`` holds another model or optimizer than this run's (the first keys
        or shapes that differ), or None. Rank 0, before anything is loaded."""
        saved = load_weights_only(info.path / MODEL_FILE, map_location="cpu", mmap=True)
        mine = self.model.state_dict()
        missing = [k for k in mine if k not in saved]
        unexpected = [k for k in saved if k not in mine]
        shapes = [f"{k} {tuple(saved[k].shape)} there, {tuple(v.shape)} here" for k, v in mine.items()
                  if k in saved and torch.is_tensor(v) and torch.is_tensor(saved[k]) and saved[k].shape != v.shape]
        parts = [f"{what}: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}"
                 for what, keys in (("your model's keys it lacks", missing), ("keys your model lacks", unexpected),
                                    ("other shapes", shapes)) if keys]
        if parts:
            return (f"cannot resume: checkpoint {info.path} holds another model ({'; '.join(parts)}); load a "
                    f"checkpoint of this model, or save this one into another output folder (nothing was changed)")
        groups = load_weights_only(info.path / OPTIMIZER_FILE, map_location="cpu", mmap=True).get("param_groups", [])
        theirs = [len(g.get("params", [])) for g in groups]
        ours = [len(g["params"]) for g in self.optimizer.state_dict()["param_groups"]]
        if theirs != ours:
            return (f"cannot resume: checkpoint {info.path} holds an optimizer of {len(theirs)} parameter group(s) "
                    f"of {theirs} parameters, yours has {len(ours)} of {ours}; build the optimizer as the run "
                    f"that wrote it did (nothing was changed)")
        return None

    def _past_data(self, info: CheckpointInfo, notes: list[str]) -> str | None:
        """Why checkpoint ``info``'s position lies past this run's data (one line naming both), or None;
        a note when it was written on data of another length."""
        if self.data is None:
            return None
        position, saved = self.data.position, info.manifest.get("data") or {}
        epoch, consumed = int(info.manifest.get("epoch", 0)), int(info.manifest.get("consumed", 0))
        here = self.data.facts()
        same = saved.get("samples") == here["samples"]
        if consumed > position.epoch_samples or (consumed == position.epoch_samples and consumed and not same):
            trained = f" (written on {saved['samples']} samples)" if "samples" in saved else ""
            return (f"cannot resume: checkpoint {info.path} is {consumed} samples into epoch {epoch + 1}{trained}, "
                    f"past the end of this data: {here['samples']} samples, an epoch of {position.epoch_samples} at "
                    f"{position.size} workers; load it with the data it was trained on (nothing was changed)")
        if "samples" in saved and saved != here:
            notes.append(f"checkpoint {info.path} was written training on data {saved}, this run's is {here}: the "
                         f"order of epoch {epoch + 1} is dealt from this data")
        return None


def _hyperparameters(optimizer: Any) -> dict[str, Any]:
    """``optimizer``'s settings per parameter group, as ``"lr"`` (one group) or ``"param_groups[1].lr"``
    (with a scheduler, its ``initial_lr`` in place of ``lr``)."""
    groups = optimizer.param_groups
    return {(key if len(groups) == 1 else f"param_groups[{i}].{key}"): value for i, group in enumerate(groups)
            for key, value in group.items() if key != "params" and isinstance(value, (int, float, str, bool, tuple))
            and not (key == "lr" and "initial_lr" in group)}  # a scheduler's: lr is where its schedule stands
