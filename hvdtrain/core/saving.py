"""The run's checkpoint policy: when a checkpoint is due, and what one holds.

A step checkpoint is due every ``checkpoint.every_steps`` optimizer steps, except on an epoch's
last micro-batch (the epoch checkpoint that follows covers it); an epoch checkpoint is written
after every evaluation when ``checkpoint.enabled``. :meth:`CheckpointPolicy.save` is a sequence of
collectives, so every rank calls it at the same step: the running statistics (BatchNorm) are
averaged, every rank's RNG state, partial totals and gradient-exchange state are gathered to rank 0
(only rank 0 holds them all: :func:`~hvdtrain.core.compression_state.gather_to_root`; at a step
checkpoint each rank's own running statistics too, which it keeps training on), and rank 0
writes model, optimizer, ``rank_state.json`` and the manifest through the
:class:`~hvdtrain.core.checkpoint.CheckpointManager`, atomically.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from pathlib import Path
from typing import Any

from hvdtrain._version import __version__
from hvdtrain.core import compression_state
from hvdtrain.core.adapter import NonFiniteStateError
from hvdtrain.core.checkpoint import CheckpointManager
from hvdtrain.core.config import RunConfig, to_dict
from hvdtrain.core.errors import TrainingError
from hvdtrain.core.redact import redact_values
from hvdtrain.core.resume import RANK_STATE_FILE, Position, capture_rng


def framework_version(framework: str) -> str:
    """The installed version of ``framework``'s package (the manifest records it), or "unknown"."""
    names = {"torch": ("torch",), "tensorflow": ("tensorflow-cpu", "tensorflow", "tensorflow_cpu")}[framework]
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


class CheckpointPolicy:
    """Decides when this run checkpoints and writes the checkpoints (see the module docstring)."""

    def __init__(self, config: RunConfig, manager: CheckpointManager, adapter: Any, watchdog: Any):
        self.config, self.manager, self.adapter, self.watchdog = config, manager, adapter, watchdog
        # a checkpoint without the files this adapter's load_state reads is damaged, even if its
        # manifest (which does not list them) verifies
        manager.required, manager.framework = tuple(adapter.checkpoint_files), config.framework

    def due(self, step: int, applied: bool, last_in_epoch: bool) -> bool:
        """Whether a step checkpoint is due after this micro-batch (optimizer step ``step``)."""
        every = self.config.checkpoint.every_steps
        return bool(applied and every and step % every == 0 and not last_in_epoch)

    def maybe_save(self, ctx: Any, position: Position, stats: Any, applied: bool, last_in_epoch: bool) -> bool:
        """Write step checkpoint ``step-<step>`` if :meth:`due`; returns whether it did (on every rank)."""
        if not self.due(position.step, applied, last_in_epoch):
            return False
        self.save(ctx, f"step-{position.step:08d}", position, stats.totals(), None)
        return True

    def at_epoch_end(self, ctx: Any, position: Position, record: dict[str, Any],
                     totals: dict[str, Any] | None = None) -> Path | None:
        """Write epoch checkpoint ``epoch-<epoch>`` (when ``checkpoint.enabled``) and add its cost to
        ``record`` as ``checkpoint_sec``; returns its path on rank 0, else None. An epoch cut short
        (``train.max_steps``: ``position`` inside it) is checkpointed as ``step-<step>`` with the
        epoch's running ``totals``, as a step checkpoint is."""
        if not self.config.checkpoint.enabled:
            return None
        started = time.perf_counter()
        name = f"step-{position.step:08d}" if position.consumed else f"epoch-{position.epoch:04d}"
        kept = totals if position.consumed and totals is not None else {"loss_sum": 0.0, "samples": 0}
        saved = self.save(ctx, name, position, kept, record)
        record["checkpoint_sec"] = time.perf_counter() - started  # rank 0: gather + write
        return saved

    def save(self, ctx: Any, name: str, position: Position, totals: dict[str, Any],
             record: dict[str, Any] | None) -> Path | None:
        """Collect every rank's RNG state and partial ``totals`` (a collective: all ranks call this at the
        same step), then rank 0 writes checkpoint ``name`` atomically. Returns its path on rank 0.
        A step checkpoint's model holds the ranks' mean running statistics (BatchNorm), every rank's
        own are kept beside it and each rank trains on with its own: a checkpoint changes nothing."""
        own = None
        if record is None:  # an epoch-end checkpoint follows the evaluation, which already averaged them
            own = compression_state.own_buffers(self.adapter)  # this rank's, before averaging
            self.adapter.sync_model_buffers()  # distributed: every rank's BatchNorm statistics -> their mean
        try:
            return self._save(ctx, name, position, totals, record, own)
        finally:
            if own is not None:
                self.adapter.set_model_buffers(own)

    def _save(self, ctx: Any, name: str, position: Position, totals: dict[str, Any],
              record: dict[str, Any] | None, own: list[Any] | None) -> Path | None:
        cfg, adapter = self.config, self.adapter
        mine = {"rng": {**capture_rng(), "framework": adapter.rng_state()}, **totals}
        self.watchdog.beat(position.step, "waiting in collectives (checkpoint)")
        rank_states = compression_state.gather_to_root(adapter, mine)  # distributed: rank 0 keeps them
        # -- the gradient exchange's per-rank state (error buffers, Q, local-SGD replicas) --
        comm_states = compression_state.gather(adapter, own)  # distributed
        adapter.gather_state()  # distributed: pipeline stages bring their state to rank 0
        if not ctx.is_main:
            return None
        self.watchdog.beat(position.step, "writing a checkpoint")
        def write(directory: Path) -> None:
            adapter.save_state(directory)
            compression_state.write(directory, comm_states)
            (directory / RANK_STATE_FILE).write_text(json.dumps(rank_states))

        manifest = {"kind": "epoch" if record is not None else "step", "epoch": position.epoch,
                    "consumed": position.consumed, "step": position.step, "recipe": cfg.recipe,
                    "framework": cfg.framework, "world_size": ctx.size, "batch_size": cfg.train.batch_size,
                    "config": redact_values(to_dict(cfg)), "metrics": record, "hvdtrain_version": __version__,
                    "framework_version": framework_version(cfg.framework)}
        try:
            return self.manager.save(name, write, manifest).path
        except NonFiniteStateError:  # save_state refused before writing anything
            raise TrainingError(f"model parameters are not finite at optimizer step {position.step}; "
                                f"refusing to write checkpoint {name}") from None
        except Exception as exc:  # OSError from us, RuntimeError from torch.save, ... on a full disk
            raise TrainingError(f"could not write checkpoint {name} in {self.manager.directory}: {exc}; "
                                f"nothing partial was left and earlier checkpoints are intact") from None
