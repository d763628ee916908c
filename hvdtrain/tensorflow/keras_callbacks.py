"""Keras 3 callbacks for ``model.fit`` on Horovod (public as :mod:`hvdtrain.keras`): the initial
broadcast of model and optimizer variables, metric averaging at each epoch's end, and rank-0
checkpoints with exact resume.

Checkpoints are hvdtrain's own (:class:`hvdtrain.core.checkpoint.CheckpointManager`): one folder
per epoch, ``epoch-NNNN/``, written by rank 0 atomically with a manifest of SHA-256 checksums,
holding the model's and the optimizer's variables as the TensorFlow adapter writes them
(:mod:`hvdtrain.tensorflow.checkpoint`: ``.npz``, no pickled object, read back checked). The
optimizer's variables include its iteration count, so its learning-rate schedule resumes too. A
:func:`~hvdtrain.keras.DistributedOptimizer` whose exchange keeps per-worker state (PowerSGD's and
top-k's error feedback, local SGD's replicas) adds every worker's copy as ``comm_state.npz``, the
Trainer's file (:mod:`hvdtrain.core.compression_state`).
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain.core import compression_state
from hvdtrain.core.checkpoint import CheckpointError, CheckpointManager
from hvdtrain.core.config_error import ConfigError
from hvdtrain.tensorflow.adapter import offset_seed_states
from hvdtrain.tensorflow.checkpoint import MODEL_FILE, OPTIMIZER_FILE, load_variables, save_variables
from hvdtrain.tensorflow.compression import tf_variables
from hvdtrain.tensorflow.keras_exchange import Holder, exchange_of

KIND = "keras-fit"  # a manifest's "kind": written by hvdtrain.keras.Checkpoints
# the models whose variables Checkpoints.restore broadcast, then gave each worker its own exchange state
_RESTORED: "weakref.WeakSet[keras.Model]" = weakref.WeakSet()


def _optimizer_built(model: keras.Model, optimizer: Any = None) -> keras.optimizers.Optimizer | None:
    """``optimizer`` (default: the compiled model's, None if it has none), its variables created
    for the model's trainable variables (as ``model.fit`` would create them)."""
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    return optimizer


def broadcast_variables(model: keras.Model, root_rank: int = 0, optimizer: Any = None) -> None:
    """Every worker's model and optimizer variables set to ``root_rank``'s (``optimizer``: the
    compiled model's by default; its variables are created first; a custom ``tf.GradientTape``
    loop passes its own). The layers' seed states (Dropout's) then move ``rank`` strides apart, so
    each worker draws its own dropout masks while rank 0 keeps its stream (what a checkpoint
    stores restores every worker's)."""
    optimizer = _optimizer_built(model, optimizer)
    variables = list(model.variables) + (list(optimizer.variables) if optimizer is not None else [])
    if hvd.size() > 1:
        hvd.broadcast_variables(tf_variables(variables), root_rank=root_rank)  # distributed
    offset_seed_states([v for v in model.variables if "seed_generator_state" in getattr(v, "path", v.name)],
                       hvd.rank())


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of ``fit``, every worker's model and optimizer variables from ``root_rank``
    (:func:`broadcast_variables`): Horovod's callback of the same name, for Keras 3."""

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank
        self.done = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Broadcast once (a second ``fit`` with this callback does not broadcast again, nor one after
        :meth:`Checkpoints.restore`, which broadcast the variables and then gave each worker its own
        exchange state: local SGD's replica)."""
        if not self.done and self.model not in _RESTORED:
            broadcast_variables(self.model, self.root_rank)
        self.done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, every numeric value in ``logs`` (loss, metrics, ``val_*``) replaced by
    its average over the workers, in one allreduce, so that the callbacks after this one
    (checkpoints, early stopping, ``History``) see the same numbers on every rank. Put it first
    in the list. Each worker's values weigh the same: give the workers equal shares of the data
    (:func:`hvdtrain.keras.shard`)."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Average ``logs`` in place (keys in sorted order, the same on every rank)."""
        if not logs or hvd.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64)
        averaged = hvd.allreduce(values, op=hvd.Average, name=f"hvdtrain.keras.metrics.{epoch}")  # distributed
        for key, value in zip(keys, averaged.numpy().tolist()):
            logs[key] = value


class Checkpoints(keras.callbacks.Callback):
    """Rank-0 checkpoints of model and optimizer variables at each epoch's end, and the exact
    resume from the newest one (:meth:`restore`, before ``fit``)::

        checkpoints = hvdtrain.keras.Checkpoints("runs/mnist/checkpoints")
        initial_epoch = checkpoints.restore(model, resume=args.resume)
        model.fit(..., initial_epoch=initial_epoch, callbacks=[..., checkpoints])

    ``every``: epochs between checkpoints (the last epoch of ``fit`` is always written);
    ``keep_last``: how many to keep. The folder's checkpoints are never overwritten: a run that
    finds some there and was not asked to resume stops with one line naming the folder (a ``fit``
    whose :meth:`restore` was not called runs ``restore(model, resume=False)`` as it begins)."""

    def __init__(self, directory: str | Path, every: int = 1, keep_last: int = 3):
        super().__init__()
        if int(every) < 1:
            raise ConfigError(f"Checkpoints: every={every!r} must be at least 1")
        self.manager = CheckpointManager(directory, keep_last=keep_last)
        self.manager.required = (MODEL_FILE, OPTIMIZER_FILE)
        self.manager.framework = "tensorflow"
        self.every = int(every)
        self.epochs: int | None = None
        self.restored = False  # restore() ran (else fit's start runs it, refusing existing checkpoints)

    @property
    def directory(self) -> Path:
        """Where the epoch folders are."""
        return self.manager.directory

    def restore(self, model: keras.Model, resume: bool = True) -> int:
        """Call before ``fit``, on every worker: the newest checkpoint's model and optimizer
        variables (read by rank 0, then broadcast: the workers need no shared disk) and the number
        of epochs it had completed, for ``fit(initial_epoch=...)``; 0 and rank 0's variables
        broadcast where there is none. ``resume=False`` with checkpoints present: a
        :class:`~hvdtrain.core.checkpoint.CheckpointError` naming the folder (nothing is
        overwritten)."""
        optimizer = _optimizer_built(model)  # the same variables the checkpoint was written from
        if optimizer is None:
            raise ConfigError("Checkpoints.restore: the model has no optimizer; call model.compile(optimizer=...) "
                              "first")
        found, problem, path, world_size = None, None, None, hvd.size()
        if hvd.rank() == 0:
            try:
                found, problem, path, world_size = self._read_latest(model, optimizer, resume, world_size)
            except Exception as exc:  # noqa: BLE001 - whatever rank 0 meets, every rank hears of it, none waits
                problem = f"{self.directory}: cannot look for a checkpoint to resume ({type(exc).__name__}: {exc})"
        found, problem, path, world_size = hvd.broadcast_object((found, problem, path, world_size), root_rank=0,
                                                                name="hvdtrain.keras.restore")
        if problem is not None:
            raise CheckpointError(problem)
        broadcast_variables(model)
        # each worker's own exchange state (error feedback, local SGD's replica); afresh from another world size
        compression_state.restore(Holder(exchange_of(optimizer), "restore"),
                                  {"checkpoint": path, "manifest": {"world_size": world_size}}, hvd.rank(), hvd.size())
        _RESTORED.add(model)
        self.restored = True
        return int(found or 0)

    def _read_latest(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, resume: bool,
                     world_size: int) -> tuple[int | None, str | None, str | None, int]:
        """Rank 0's half of :meth:`restore`: ``(epochs, problem, path, world_size)`` of the newest
        checkpoint loaded into ``model`` and ``optimizer``, or the one-line problem that stops every
        rank. A checkpoint whose checksums match but whose files cannot be read as this model's
        variables (a truncated or foreign ``.npz``: ``BadZipFile``, ``TypeError``, ``KeyError``...)
        is a problem naming it, not an exception on rank 0 alone."""
        self.manager.remove_temporaries()  # what a killed writer left
        latest = self.manager.latest([])
        if latest is None:
            return None, None, None, world_size
        if not resume:
            return None, (f"{self.directory} already holds checkpoint {latest.path.name}: resume from it "
                          f"(Checkpoints.restore(model, resume=True)) or give Checkpoints another directory; "
                          f"nothing was overwritten"), None, world_size
        if latest.manifest.get("kind") != KIND:
            return None, f"{latest.path} was not written by hvdtrain.keras.Checkpoints; not resuming from it", \
                None, world_size
        try:
            load_variables(latest.path / MODEL_FILE, model.variables)
            load_variables(latest.path / OPTIMIZER_FILE, optimizer.variables)
        except (ValueError, CheckpointError) as exc:  # the reader's own line (another model's variables)
            problem = str(exc)
            return None, problem if str(latest.path) in problem else f"checkpoint {latest.path}: {problem}", \
                None, world_size
        except Exception as exc:  # noqa: BLE001 - a file that passed its checksum but is not what it claims
            return None, (f"checkpoint {latest.path}: its files match their checksums but cannot be read as this "
                          f"model's variables ({type(exc).__name__}: {exc}); move it aside to resume from the "
                          f"one before"), None, world_size
        return latest.epoch, None, str(latest.path), int(latest.manifest.get("world_size", world_size))

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Note ``fit``'s epoch count (its last epoch is always checkpointed); without a
        :meth:`restore` before, refuse a folder that holds checkpoints (every rank)."""
        self.epochs = self.params.get("epochs") if self.params else None
        if not self.restored:
            self.restore(self.model, resume=False)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Rank 0 writes ``epoch-<epoch + 1>`` (epochs completed), with ``logs`` as its metrics (every
        rank sends its exchange state, if it keeps one)."""
        done = epoch + 1
        if done % self.every and done != self.epochs:
            return
        optimizer = self.model.optimizer
        states = compression_state.gather(Holder(exchange_of(optimizer), f"save.{done}"))  # distributed
        if hvd.rank() != 0:
            return
        metrics = {k: float(v) for k, v in (logs or {}).items() if _is_number(v) and math.isfinite(float(v))}

        def write(folder: Path) -> None:
            save_variables(folder / MODEL_FILE, self.model.variables)
            save_variables(folder / OPTIMIZER_FILE, optimizer.variables)
            compression_state.write(folder, states)

        self.manager.save(f"epoch-{done:04d}", write, {
            "kind": KIND, "framework": "tensorflow", "epoch": done, "step": int(optimizer.iterations.numpy()),
            "world_size": hvd.size(), "metrics": metrics})


def _is_number(value: Any) -> bool:
    try:
        return np.ndim(value) == 0 and isinstance(float(value), float)
    except (TypeError, ValueError):
        return False
