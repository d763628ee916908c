"""The one small interface both framework adapters implement, with the same method names.

The training loop (:mod:`hvdtrain.core.loop`) talks only to this interface; everything that
touches torch, TensorFlow or ``horovod.<framework>`` lives in :mod:`hvdtrain.torch` and
:mod:`hvdtrain.tensorflow`. :func:`load_adapter` imports one of them by name and turns a missing
framework into an error that says which extra to install.

An adapter writes twelve methods, the same in both frameworks:

========================  ==============================================================  ===================
method                    does                                                            collective?
========================  ==============================================================  ===================
``init(config)``          ``hvd.init()``, threads, seeds, device; sets ``collectives``    no (Horovod's init)
``prepare(task, config)`` model, optimizer, loss; the gradient exchange; optimizer state  no
``broadcast_state(root)`` parameters, buffers and optimizer state from ``root``           yes
``set_learning_rate(lr)`` the LR of the next update                                       no
``train_step(...)``       forward, backward; on the window's last micro-batch the         yes (the exchange)
                          exchange, clip, finite check and update
``eval_step(x, y)``       local loss and metric sums                                      no
``sync_model_buffers()``  BatchNorm statistics averaged over the ranks                    yes
``reseed(seed)``          this rank's framework random stream (dropout)                   no
``rng_state()``           that stream as JSON-able data                                   no
``set_rng_state(state)``  put it back                                                     no
``save_state(dir)``       model and optimizer files (rank 0), refusing non-finite ones    no
``load_state(dir)``       read them back (rank 0)                                         no
========================  ==============================================================  ===================

Written once here, on what ``init`` sets: ``context()``, the object collectives and sums
(:class:`~hvdtrain.core.collectives.Collectives`), ``barrier``, ``sync_replicas`` (the exchange's),
``gather_state`` (pipeline stages), ``elastic_reset``, ``restart_window`` (the accumulation of
an elastic sync) and an elastic ``snapshot`` built on
``save_state``/``load_state`` (both adapters override it with an in-memory copy). Pipeline stages
are not a subclass: the adapter holds a :class:`~hvdtrain.core.gpipe.GPipe` driver
(``adapter.pipeline``) that takes over the methods :data:`~hvdtrain.core.gpipe.PIPELINED` names.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdtrain.core.config import FRAMEWORKS


class FrameworkMissingError(ImportError):
    """The requested framework (or Horovod's build for it) is not installed."""


class NonFiniteGradientError(FloatingPointError):
    """The allreduced gradient holds NaN or infinity (identical on every rank, so all ranks stop).
    ``updates_ago``: how many updates before the one that raised it the gradient was not finite (a
    GPU reads its finite check once per log interval, not per update: :mod:`hvdtrain.torch.finite`)."""

    def __init__(self, message: str, updates_ago: int = 0) -> None:
        super().__init__(message)
        self.updates_ago = updates_ago


class NonFiniteStateError(FloatingPointError):
    """The model's parameters hold NaN or infinity: :meth:`FrameworkAdapter.save_state` refuses to
    write them."""


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    replica: int | None = None  # pipeline parallelism: this rank's data-parallel replica (None: its rank)
    replicas: int | None = None  # pipeline parallelism: the number of replicas (None: the world size)
    mpi: bool = False  # Horovod runs on its MPI controller (else Gloo)
    gpu: bool = False  # this process trains on a GPU

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that prints and writes files."""
        return self.rank == 0

    @property
    def data_rank(self) -> int:
        """Which data shard this rank reads: its rank, or with pipeline stages its replica (all
        stages of a replica read the same batches)."""
        return self.rank if self.replica is None else self.replica

    @property
    def data_size(self) -> int:
        """The data-parallel width (shards, LR scaling): the world size, or the number of replicas."""
        return self.size if self.replicas is None else self.replicas


class FrameworkAdapter(ABC):
    """Horovod plumbing for one framework. One instance per process, used in this order:
    ``init`` -> ``prepare`` -> (``load_state`` on rank 0) -> ``broadcast_state`` -> steps.
    The twelve abstract methods are the whole interface an adapter writes (table in the module
    docstring); everything else below is written once, on what ``init`` sets: ``self.collectives``
    (:class:`~hvdtrain.core.collectives.Collectives` on the framework's Horovod module) and
    ``self.gpu``.
    """

    name: str = ""
    skipped_updates: int = 0
    overlap: bool = False  # set by prepare(): the exchange plan's overlap (allreduce during backward)
    collectives: Any = None  # set by init(): hvdtrain.core.collectives.Collectives
    gpu: bool = False  # set by init(): this process trains on a GPU
    pipeline: Any = None  # set by init() with parallel.pipeline_stages > 1: hvdtrain.core.gpipe.GPipe
    # The gradient exchange (hvdtrain.core.exchange): set by prepare() from the run's exchange plan
    # (hvdtrain.core.exchange_plan); the update calls its reduce() and after_update(),
    # hvdtrain.core.compression_state its keeps_state, state(), load_state() and reset(), bitwise mode
    # (hvdtrain.core.reproducible) its begin_micro_batch(). None where an adapter exchanges gradients
    # its own way (pipeline stages).
    exchange: Any = None
    # The task, its model and the optimizer the adapter steps: set by prepare() (and by
    # hvdtrain.core.gpipe for pipeline stages, which sets them to the stage's).
    task: Any = None
    model: Any = None
    optimizer: Any = None
    accumulation: int = 1  # set by prepare(): micro-batches per update on this worker
    # The files load_state() always reads: a checkpoint folder without them is damaged (skipped when
    # looking for the latest; hvdtrain.core.saving hands them to the CheckpointManager).
    checkpoint_files: tuple[str, ...] = ()

    @abstractmethod
    def init(self, config: Any) -> DistContext:
        """Initialise Horovod for the :class:`~hvdtrain.core.config.RunConfig` ``config``, set
        intra-op threads and seeds, ``self.collectives`` and ``self.gpu``; return
        :meth:`context`."""

    @abstractmethod
    def prepare(self, task: Any, config: Any) -> None:
        """Take the recipe's model, optimizer and loss; wire them to the gradient exchange
        (compression, accumulation, mixed precision) and create all optimizer state."""

    def begin_epoch(self, epoch: int) -> None:
        """Called by the loop before each training epoch (``epoch`` 0-based, the resumed one
        included): adapters that support ``model.freeze_backbone_epochs`` freeze or release the
        backbone here (:mod:`hvdtrain.core.finetune`). Not a collective; by default nothing."""

    # Set by the Trainer before prepare(): True when the task's own optimizer and scheduler set the LR
    # (hvdtrain.core.optimizer_policy), so set_learning_rate is never called and the LR is read back.
    task_lr: bool = False

    def describe_optimizer(self, task: Any) -> Any:
        """The task's optimizer and scheduler as an :class:`~hvdtrain.core.optimizer_policy.OptimizerFacts`,
        read before :meth:`prepare`; None (this default) keeps hvdtrain's schedule for it."""
        return None

    def learning_rate(self) -> float:
        """The LR the next update uses, read from the optimizer (``task_lr``: what the loop reports)."""
        raise NotImplementedError(f"{type(self).__name__} does not read its optimizer's LR")

    def step_scheduler(self) -> None:
        """After every optimizer update with ``task_lr``: step the task's own scheduler once (by
        default there is none)."""

    @abstractmethod
    def broadcast_state(self, root_rank: int = 0) -> None:
        """Copy model parameters and optimizer state from ``root_rank`` to every rank."""

    @abstractmethod
    def set_learning_rate(self, lr: float) -> None:
        """Set the optimizer's learning rate for the next update."""

    @abstractmethod
    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True, weight: float | None = None) -> Any:
        """Forward and backward on one local micro-batch; when ``apply_update``, exchange the
        accumulated gradients and update. ``weight`` is this micro-batch's share of the
        accumulation window (its samples / the window's samples; None: ``1 / grad_accumulation``),
        so a short last window gives the gradient of its concatenated batch. Returns this rank's
        loss as a framework scalar (``float()`` reads it; the loop avoids doing so every step). A
        non-finite exchanged gradient raises :class:`NonFiniteGradientError`
        (``train.nonfinite=error``) or skips the update and counts it in ``skipped_updates``
        (``skip``); so do updates a mixed-precision loss scaler skips."""

    def convert_batch(self, inputs: Any, targets: Any) -> tuple[Any, Any]:
        """A loaded batch as :meth:`train_step` and :meth:`eval_step` take it, called where the batch
        is loaded (the prefetch thread: :func:`~hvdtrain.core.prefetch.load_batches`), so the loop's
        thread does not convert it between steps. Not a collective; by default the batch as loaded."""
        return inputs, targets

    @abstractmethod
    def eval_step(self, inputs: Any, targets: Any) -> dict[str, Any]:
        """Local sums on one batch: ``loss_sum``, ``count`` and the task's metric sums (framework
        scalars that add up and convert with ``float()``)."""

    @abstractmethod
    def sync_model_buffers(self) -> None:
        """Average the model's floating-point running statistics (BatchNorm means and variances)
        over all ranks, so every rank holds the model rank 0 saves."""

    @abstractmethod
    def reseed(self, seed: int) -> None:
        """Seed this process's framework random generators (dropout) with ``seed``; the loop
        passes a different seed on every rank."""

    @abstractmethod
    def rng_state(self) -> dict[str, Any]:
        """This rank's framework random-number state as JSON-able data."""

    @abstractmethod
    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`rng_state` returned."""

    @abstractmethod
    def save_state(self, directory: Path) -> None:
        """Write model and optimizer state into ``directory`` (rank 0 only); a model whose
        parameters are not all finite raises :class:`NonFiniteStateError` before anything is
        written."""

    @abstractmethod
    def load_state(self, directory: Path) -> None:
        """Read model and optimizer state written by :meth:`save_state`."""

    # -- written once, on self.collectives ---------------------------------------------------

    def context(self) -> DistContext:
        """This process's place in the job as Horovod sees it now (it changes in elastic mode);
        with pipeline stages, its data shard is its replica's."""
        hvd = self.collectives.hvd
        ctx = DistContext(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), mpi=hvd.mpi_enabled(),
                          gpu=self.gpu)
        self.ctx = self.pipeline.context(ctx) if self.pipeline is not None else ctx
        return self.ctx

    def allreduce_sums(self, values: dict[str, float]) -> dict[str, float]:
        """Sum each value across ranks (one collective, same keys on every rank)."""
        return self.collectives.allreduce_sums(values)

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        """A picklable object from ``root_rank``, on every rank."""
        return self.collectives.broadcast_object(obj, root_rank)

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, as a list indexed by rank, on every rank."""
        return self.collectives.allgather_object(obj)

    def gather_object_to_root(self, obj: Any) -> list[Any] | None:
        """Every rank's picklable ``obj``, indexed by rank, on rank 0; None elsewhere (no other rank
        receives anything: the checkpoint's per-rank state)."""
        return self.collectives.gather_object_to_root(obj)

    def scatter_objects_from_root(self, items: list[Any] | None) -> Any:
        """Rank 0's ``items[r]`` on each rank ``r`` (``items`` read on rank 0 only)."""
        return self.collectives.scatter_objects_from_root(items)

    def allreduce_mean(self, values: dict[str, float], ctx: DistContext) -> dict[str, float]:
        """Average each value across ranks."""
        return {k: v / ctx.size for k, v in self.allreduce_sums(values).items()}

    def barrier(self) -> None:
        """Wait until every rank arrives (a tiny allreduce)."""
        self.allreduce_sums({"barrier": 0.0})

    def model_buffers(self) -> list[Any] | None:
        """This rank's own running statistics (BatchNorm) as NumPy copies, what a step checkpoint keeps
        per rank (:mod:`hvdtrain.core.compression_state`); None (this default): the adapter keeps none."""
        return None

    def set_model_buffers(self, values: list[Any]) -> None:
        """Put back what :meth:`model_buffers` returned (this default keeps none: nothing to put back)."""

    def sync_replicas(self) -> None:
        """Local SGD: average the workers' models now (a collective; before evaluations). Otherwise
        the replicas are equal already and nothing happens."""
        if self.exchange is not None:
            self.exchange.sync_replicas()

    def gather_state(self) -> None:
        """Collective on every rank just before rank 0 saves a checkpoint: an adapter whose state is
        spread over ranks (pipeline stages) brings it to rank 0 here. Default: nothing to do."""

    # -- elastic mode --------------------------------------------------------------------------

    def elastic_reset(self) -> None:
        """Shut Horovod down and initialise it again with the new set of workers; the gradient
        exchange's per-rank state starts afresh."""
        from hvdtrain.core import compression_state  # the exchange's state lives beside the checkpoint code

        self.collectives.hvd.shutdown()
        self.collectives.hvd.init()
        compression_state.reset(self, "elastic: the job re-formed")

    def restart_window(self, accumulation: int) -> None:
        """Start a fresh accumulation window of ``accumulation`` micro-batches per worker per update
        (every elastic sync, :mod:`hvdtrain.core.elastic`): what a window cut short by a lost worker
        had accumulated is dropped (those micro-batches run again), and a fixed global batch re-formed
        on another world size accumulates its new share. This default sets ``accumulation`` and calls
        the exchange's ``restart(accumulation)`` (every exchange has one: most have nothing to do);
        an adapter that accumulates gradients elsewhere drops them in its own override."""
        self.accumulation = accumulation
        if self.exchange is not None:
            self.exchange.restart(accumulation)

    def snapshot(self) -> Any:
        """An in-memory copy of model and optimizer state (elastic commits). This default keeps what
        :meth:`save_state` writes, as bytes; adapters override it with a cheaper copy."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="hvdtrain-snapshot-") as tmp:
            self.save_state(Path(tmp))
            return {f.name: f.read_bytes() for f in Path(tmp).iterdir() if f.is_file()}

    def restore_snapshot(self, snapshot: Any) -> None:
        """Put back what :meth:`snapshot` returned."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="hvdtrain-snapshot-") as tmp:
            for name, data in snapshot.items():
                (Path(tmp) / name).write_bytes(data)
            self.load_state(Path(tmp))


#: Everything a module of :mod:`hvdtrain.core` touches on an adapter (reads, calls or sets), each
#: declared on :class:`FrameworkAdapter` above; ``tests/unit/test_adapter_contract.py`` parses the
#: core modules and checks that this is exactly what they touch, and that both adapters implement it.
CORE_TOUCHES = (
    # set by init() / prepare(), read by core
    "name", "exchange", "checkpoint_files", "task", "model", "optimizer", "accumulation", "skipped_updates",
    "task_lr",
    # the methods an adapter writes (the table in the module docstring) and the optional ones
    "init", "prepare", "describe_optimizer", "begin_epoch", "learning_rate", "set_learning_rate", "step_scheduler",
    "broadcast_state", "convert_batch", "train_step", "eval_step", "sync_model_buffers", "model_buffers",
    "set_model_buffers",
    "reseed", "rng_state", "set_rng_state", "save_state", "load_state",
    # written once on FrameworkAdapter
    "context", "allreduce_sums", "broadcast_object", "allgather_object", "gather_object_to_root",
    "scatter_objects_from_root", "barrier", "sync_replicas", "gather_state", "elastic_reset", "restart_window",
    "snapshot", "restore_snapshot",
)

#: The attributes of :data:`CORE_TOUCHES` that the base class leaves None and an adapter's
#: ``prepare`` sets.
SET_BY_PREPARE = ("exchange", "task", "model", "optimizer")


_ADAPTERS = {"torch": ("hvdtrain.torch", "TorchAdapter", "torch"),
             "tensorflow": ("hvdtrain.tensorflow", "TensorFlowAdapter", "tensorflow")}


def load_adapter(framework: str, pipeline_stages: int = 1) -> FrameworkAdapter:
    """An adapter instance for ``framework``, or a clear error naming what to install. The same
    adapter serves ``parallel.pipeline_stages > 1``: it reads the stages from the config in
    ``init`` and then holds its stage (:class:`hvdtrain.core.gpipe.GPipe`); ``pipeline_stages`` is
    accepted for callers that name it."""
    if framework not in _ADAPTERS:
        raise ValueError(f"framework {framework!r} is not supported; choose one of: {', '.join(FRAMEWORKS)}")
    module_name, class_name, extra = _ADAPTERS[framework]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FrameworkMissingError(
            f"the {framework} adapter cannot be imported ({exc}). Install the framework with "
            f"`pip install hvdtrain[{extra}]` and Horovod built with it "
            f"(`make setup` does both; `horovodrun --check-build` shows what Horovod has)") from exc
    return getattr(module, class_name)()
