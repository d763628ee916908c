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

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import horovod.torch as hvd
import torch

from hvdtrain.core import own_loop, resume, rules, startup
from hvdtrain.core.checkpoint import MANIFEST, CheckpointManager
from hvdtrain.core.config import ConfigError, RunConfig, dump_yaml, load_config, parse_override
from hvdtrain.core.durable import atomic_write_text
from hvdtrain.core.errors import type_name
from hvdtrain.core.optimizer_policy import LRPolicy, ran_config
from hvdtrain.core.outputdir import CONFIG_FILE
from hvdtrain.core.rank0 import RankZeroGate
from hvdtrain.core.redact import redact_values
from hvdtrain.core.resume import METRICS_FILE, Position
from hvdtrain.core.saving import CheckpointPolicy
from hvdtrain.core.visibility import ConfigNotes
from hvdtrain.core.watchdog import StallWatchdog
from hvdtrain.torch.adapter import TorchAdapter
from hvdtrain.torch.positioned import PositionedLoader, loader_facts

CHECKPOINTS = "checkpoints"  # OUTPUT/checkpoints/, as the Trainer writes them


def prepare(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Any = None, scheduler: Any = None, *,
            config: RunConfig | str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
            **keys: Any) -> "OwnLoop":
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
    """
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
    return OwnLoop(model, optimizer, scheduler, cfg, loader_parts)


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
        self._adapter._apply_update()  # distributed: the exchange, the checks, the update, the zeroing
        self._loop.updates += 1
        self._attach()

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
    :meth:`print`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, config: RunConfig,
                 loader_parts: tuple | None) -> None:
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
        self.gate, self.watchdog = RankZeroGate(ctx.rank), StallWatchdog(None, ctx.rank)
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
        if isinstance(values, dict):
            keys = list(values)
            reduced = self._reduce([values[k] for k in keys], op, what)
            return dict(zip(keys, reduced))
        many = isinstance(values, (list, tuple))
        items = list(values) if many else [values]
        tensors = [torch.as_tensor(v).detach().to("cpu", torch.float64) for v in items]
        out = hvd.grouped_allreduce(tensors, op=op, name=f"hvdtrain.own_loop.{what}")  # distributed
        out = [float(o) if o.numel() == 1 else o for o in out]
        return out if many else out[0]

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

    def _manager(self, output: Path) -> CheckpointManager:
        ck = self.config.checkpoint
        manager = CheckpointManager(output / CHECKPOINTS, ck.keep_last, ck.best_metric, ck.best_mode)
        manager.required, manager.framework = self.adapter.checkpoint_files, "torch"
        return manager

    def save(self, path: str | Path, metrics: dict[str, Any] | None = None) -> Path | None:
        """Checkpoint the run into the output folder ``path`` (a collective: every rank calls it, at
        the same update): ``path/checkpoints/epoch-NNNN`` at an epoch's end, ``step-NNNNNNNN``
        inside one, written by rank 0 atomically as the Trainer writes them (model, optimizer,
        scheduler, every rank's random state and exchange state, the position), then pruned to
        ``checkpoint.keep_last``. ``metrics`` (e.g. the epoch's mean loss and validation accuracy)
        become a row of ``path/metrics.jsonl`` and the checkpoint's record, which
        ``hvdtrain report`` plots. A second call at the same position writes no second checkpoint
        (only the metrics row). Returns the checkpoint's folder on rank 0, else None."""
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
            policy = CheckpointPolicy(self.config, self._manager(output), self.adapter, self.watchdog)
            totals = {"loss_sum": 0.0, "samples": 0}
            saved = policy.save(self.ctx, name, position, totals, record if at_epoch_end else None)
            self._saved = (output.resolve(), position, saved)
        if self.is_main and metrics is not None:
            self.gate.append_jsonl(output / METRICS_FILE, record)
        return saved

    def load(self, path: str | Path) -> bool:
        """Continue from a checkpoint (a collective): ``path`` is an output folder (its newest
        checkpoint whose files match their checksums) or one checkpoint folder. Model, optimizer,
        scheduler, exchange state and position are restored; at the world size that wrote it every
        rank's random state too (bit for bit the run that was not stopped), at another the rest of
        the epoch is dealt anew and the random streams reseeded. Returns False, changing nothing,
        when the folder holds no checkpoint yet (a first start); a checkpoint of another run
        (another batch size, seed, ...) is refused naming the key."""
        path = Path(path)
        plan = resume.agree(self.adapter, self.is_main, lambda: self._plan(path))  # distributed
        if not plan.get("checkpoint"):
            return False
        output = Path(plan["checkpoint"]).parent.parent
        state = startup.start(plan, self.adapter, self.ctx, self.gate, output, self.watchdog, self.config.train.seed)
        self.updates = state.position.step
        if self.data is not None:
            self.data.position.resume_at(state.position)
        self.optimizer._attach()
        return True

    def _plan(self, path: Path) -> dict[str, Any]:
        """Rank 0: the checkpoint to load and what goes with it, or the error every rank raises."""
        try:
            notes: list[str] = []
            if (path / MANIFEST).is_file():
                info = CheckpointManager.open(path, self.adapter.checkpoint_files)
                output = path.parent.parent
            else:
                info, output = self._manager(path).latest(notes), path
            if info is None:
                return {"checkpoint": None}
            problem = resume.incompatibility(info, self.config)
            if problem:
                return {"error": problem}
            history = resume.read_history(output, info, notes)
            return {"checkpoint": str(info.path), "manifest": info.manifest, "history": history, "notes": notes}
        except Exception as exc:  # every rank must hear about it, or the others hang in the broadcast
            return {"error": str(exc)}
