"""The GPipe driver: one framework-neutral schedule over a framework's stage primitives.

:mod:`hvdtrain.core.pipeline` says where each rank sits (``rank = replica * S + stage``) and which
blocks it runs; this module runs the schedule. One optimizer step of a stage, on every rank:

1. **Forward, ``M + S - 1`` ticks** (:func:`~hvdtrain.core.pipeline.forward_ticks`). The replica's
   batch is cut into ``M`` micro-batches (:func:`~hvdtrain.core.pipeline.split_sizes`). At tick
   ``t`` stage ``s`` runs micro-batch ``t - s`` on what stage ``s - 1`` sent it one tick earlier
   (stage 0: the micro-batch's inputs) and sends its output to stage ``s + 1``. A tick in which no
   stage but the last runs has nothing to send and no transfer; every other tick is one
   ``alltoall`` on the replica's process set, in which each rank sends at most one tensor (to its
   successor) and receives at most one (from its predecessor). The last stage's output stays; in
   training every stage keeps what its backward needs.
2. **Backward, ``M + S - 1`` ticks** (:func:`~hvdtrain.core.pipeline.backward_ticks`), mirrored: the
   last stage starts with the last micro-batch, its loss scaled by the micro-batch's share of the
   batch (``sizes[m] / n``), so the micro-batches' gradients sum to the gradient of the batch's mean
   loss; each stage sends the gradient of its input to stage ``s - 1`` (a tick in which only stage 0
   runs has no transfer).
3. **Update.** Each stage averages its gradients over the ``R`` replicas that hold it (one grouped
   allreduce on the stage's process set, fp16 on the wire when the rulebook says so); the squares of
   the stages' gradient norms and the last stage's loss are summed over the replica (one float64
   allreduce on the replica's set), so every stage holds the global norm and the batch loss. A
   non-finite norm drops the step everywhere (``train.nonfinite=skip``) or raises
   :class:`~hvdtrain.core.adapter.NonFiniteGradientError` (``error``); otherwise every stage clips
   by the global norm (``optim.grad_clip_norm``) and steps its own optimizer.

Evaluation runs the forward ticks with one micro-batch; the last stage computes the sums and the
other stages report zeros under the same keys (learned once, by a broadcast from the last stage), so
the loop's allreduce adds up the replicas' last stages.

State: every stage holds only its own tensors and optimizer state. Before a checkpoint
(:meth:`GPipe.gather_state`, a collective on every rank) the stages of replica 0 send theirs to rank
0 one after another (a broadcast from stage ``s`` on replica 0's set, ``s = 1 .. S-1``), which writes
the un-cut model's format; then a global barrier, so that no rank exits before rank 0 holds
everything. A load happens on rank 0 only; :meth:`GPipe.broadcast_state` sends the whole loaded
state to every rank (which keeps its own part), then each stage's replica 0 broadcasts its stage
over the stage's set, so the replicas of a stage start equal.

The framework side is a :class:`Stage` (``hvdtrain.torch.stage`` / ``hvdtrain.tensorflow.stage``):
primitives only. The data-parallel adapter of each framework holds the driver: with
``parallel.pipeline_stages > 1`` its ``init`` opens ``adapter.pipeline`` (:meth:`GPipe.open`: this
rank's :class:`Placement`), and its ``prepare``, steps and model-state methods hand over to it
(:data:`PIPELINED`, :func:`pipelined`; :meth:`GPipe.prepare` makes the stage); learning rate, RNG
state, object collectives and sums stay the adapter's own. Every collective name used here is the
same on every rank and in both frameworks. Nothing here imports torch or TensorFlow (the stage
layer is imported by name).
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from hvdtrain.core.adapter import NonFiniteGradientError, NonFiniteStateError
from hvdtrain.core.pipeline import (Layout, backward_ticks, forward_ticks, model_blocks, resolve_cut, split_sizes,
                                    stage_blocks, tensor_owners)


# the framework stage layers, by adapter name (imported by name: core imports no framework)
STAGE_CLASSES = {"torch": ("hvdtrain.torch.stage", "TorchStage"),
                 "tensorflow": ("hvdtrain.tensorflow.stage", "TensorFlowStage")}


def enable_process_sets(config: Any) -> None:
    """With ``parallel.pipeline_stages > 1``, let Horovod add process sets after ``hvd.init()``
    (the stage and replica sets); call before it. Without pipeline stages: nothing."""
    if config.parallel.pipeline_stages > 1:
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"


@dataclass(frozen=True)
class Placement:
    """Where this rank sits in the S x R grid, with its Horovod process sets (opaque handles)."""

    layout: Layout
    rank: int
    stage_set: Any  # this stage's R ranks; None with a single replica (nothing to average)
    replica_set: Any  # this replica's S ranks (Horovod's global set when R == 1)
    world_set: Any  # every rank

    @classmethod
    def open(cls, hvd: Any, stages: int) -> "Placement":
        """This rank's place with ``stages`` pipeline stages, opening the process sets (a
        collective: every rank, in the same order). ``hvd`` is the framework's Horovod module,
        initialised after :func:`enable_process_sets`."""
        layout = Layout.for_world(hvd.size(), stages)
        stage_set, replica_set = layout.open_process_sets(hvd, hvd.rank())
        return cls(layout, hvd.rank(), stage_set, replica_set, hvd.global_process_set)

    @property
    def stage(self) -> int:
        """The stage this rank runs."""
        return self.layout.stage_of(self.rank)

    @property
    def replica(self) -> int:
        """The data-parallel replica this rank belongs to."""
        return self.layout.replica_of(self.rank)

    @property
    def first(self) -> bool:
        """True on stage 0 (it reads the micro-batch's inputs)."""
        return self.stage == 0

    @property
    def last(self) -> bool:
        """True on stage S-1 (it computes the loss and the evaluation sums)."""
        return self.stage == self.layout.stages - 1

    def context(self, ctx: Any) -> Any:
        """``ctx`` (a :class:`~hvdtrain.core.adapter.DistContext`) with this rank's replica: all
        stages of a replica read the same data shard."""
        return replace(ctx, replica=self.replica, replicas=self.layout.replicas)


@dataclass
class Cut:
    """The recipe's blocks cut into stages, as one rank sees them."""

    blocks: list[Any]  # every block, in model order
    bounds: list[int]  # the S-1 boundaries (block indices)
    owner: dict[int, int]  # stage owning each tensor, by id (a tensor two blocks share: the earlier stage)
    costs: list[float]  # each block's cost (its parameter count)
    stage: int

    @classmethod
    def of(cls, task: Any, config: Any, stage: int, cost: Callable[[Any], float],
           tensors: Callable[[Any], Any]) -> "Cut":
        """Cut ``task.pipeline_blocks()`` by ``parallel.cut`` (``cost(block)``: its size;
        ``tensors(block)``: its framework tensors, for ownership)."""
        blocks = model_blocks(task, config)
        stages = config.parallel.pipeline_stages
        costs = [cost(b) for b in blocks]
        bounds = resolve_cut(config.parallel.cut, costs, stages)
        return cls(blocks, bounds, tensor_owners(bounds, blocks, stages, tensors), costs, stage)

    @property
    def own(self) -> list[Any]:
        """The blocks this rank's stage runs, in order."""
        return [self.blocks[b] for b in stage_blocks(self.bounds, len(self.blocks), self.stage)]

    @property
    def others(self) -> list[Any]:
        """The blocks other stages run."""
        mine = stage_blocks(self.bounds, len(self.blocks), self.stage)
        return [block for b, block in enumerate(self.blocks) if b not in mine]

    def stage_of(self, tensor: Any) -> int:
        """The stage owning ``tensor`` (a tensor no block holds: stage 0)."""
        return self.owner.get(id(tensor), 0)


# the adapter methods a pipeline takes over; the rest (learning rate, RNG state, object collectives,
# sums, elastic mode, which the rulebook refuses with pipeline stages) stay the adapter's own
PIPELINED = ("prepare", "train_step", "eval_step", "broadcast_state", "sync_model_buffers", "gather_state",
             "save_state", "load_state")


def pipelined(adapter_class: type) -> type:
    """Class decorator for a data-parallel adapter: each method in :data:`PIPELINED` goes to
    ``adapter.pipeline`` (a :class:`GPipe`, opened by the adapter's ``init`` with pipeline stages)
    when there is one, with the same arguments; otherwise the adapter's own method runs. Adds the
    attribute ``pipeline = None``."""
    for name in PIPELINED:
        setattr(adapter_class, name, _to_pipeline(name, getattr(adapter_class, name)))
    adapter_class.pipeline = None
    return adapter_class


def _to_pipeline(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def dispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.pipeline is not None:
            return getattr(self.pipeline, name)(*args, **kwargs)
        return method(self, *args, **kwargs)

    return dispatch


def slice_batch(inputs: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a batch's inputs (a tensor or a dict of tensors)."""
    if isinstance(inputs, dict):
        return {k: v[start:stop] for k, v in inputs.items()}
    return inputs[start:stop]


class Stage(Protocol):
    """The framework primitives the driver needs (``hvdtrain.<framework>.stage``).

    A "state" is a dict ``{"model": {key: value}, "optimizer": {key: value}, "groups": ...}``: the
    keys name tensors and optimizer slots as the un-cut model's checkpoint does, so the parts the
    stages send to rank 0 merge by ``dict.update``; ``groups`` holds the optimizer's group settings
    (or None)."""

    placement: Placement

    # -- compute ----------------------------------------------------------------------------------
    def begin(self, inputs: Any, targets: Any, training: bool) -> tuple[Any, Any, int]:
        """Put the blocks in training or evaluation mode and the batch on the device; return the
        batch as framework tensors and its number of samples."""

    def forward(self, x: Any, inputs: Any, targets: Any, weight: float, training: bool) -> tuple[Any, Any]:
        """Run this stage's blocks on micro-batch input ``x`` (``inputs``: the micro-batch's own
        inputs, for blocks that need them). Returns ``(saved, y)``: what :meth:`backward` needs, and
        the output (sent on, or on the last stage the model's outputs). ``weight``: the
        micro-batch's share of the batch, which scales its loss."""

    def backward(self, saved: Any, y: Any, grad: Any) -> tuple[float | None, Any]:
        """Backward of one micro-batch, from ``grad`` (the gradient of ``y`` received from the next
        stage; None on the last stage, which starts from its loss), adding into the stage's
        gradients. Returns (the micro-batch's mean loss on the last stage, else None; the gradient
        of the stage's input, None on the first stage)."""

    def eval_sums(self, outputs: Any, targets: Any) -> tuple[float, dict[str, float]]:
        """The last stage's mean loss on ``outputs`` and the task's metric sums, as floats."""

    def pack(self, tensor: Any) -> Any:
        """``tensor`` as one flat float32 vector carrying its shape (one transfer, no size exchange)."""

    def unpack(self, payload: Any, requires_grad: bool) -> Any:
        """The tensor :meth:`pack` encoded (recording its gradient when ``requires_grad``)."""

    # -- the update -------------------------------------------------------------------------------
    def gradients(self) -> list[Any]:
        """This stage's summed gradients, one per own trainable tensor (zeros where none flowed)."""

    def norm(self, tensors: list[Any]) -> float:
        """The global L2 norm of ``tensors``."""

    def apply(self, grads: list[Any], clip_norm: float | None, norm: float) -> None:
        """Clip ``grads`` to ``clip_norm`` by the global ``norm`` (None: no clipping), step the
        optimizer with them and clear the gradients."""

    def discard_gradients(self) -> None:
        """Drop this step's gradients (a skipped update)."""

    def count_skipped_update(self) -> None:
        """Count one skipped update where the adapter reports them."""

    # -- collectives ------------------------------------------------------------------------------
    def alltoall(self, payload: Any, to_stage: int | None, name: str) -> Any:
        """One tick's transfer on the replica's set: send ``payload`` to ``to_stage`` (None: send
        nothing) and return what this rank received (None: nothing)."""

    def stage_average(self, tensors: list[Any], name: str, compress: bool) -> list[Any]:
        """``tensors`` averaged over this stage's replicas (one grouped allreduce on the stage's set;
        fp16 on the wire when ``compress`` and the run asked for it)."""

    def allreduce_sum(self, values: list[float], name: str, process_set: Any) -> list[float]:
        """``values`` summed over ``process_set`` (one small float64 allreduce)."""

    def broadcast_object(self, obj: Any, root_rank: int, name: str, process_set: Any) -> Any:
        """A picklable object from ``root_rank`` (a global rank) over ``process_set``."""

    # -- state of the own blocks ------------------------------------------------------------------
    def own_state(self) -> dict[str, Any]:
        """This stage's tensors and optimizer state as host copies (a state, see above)."""

    def load_own_state(self, state: dict[str, Any]) -> None:
        """Take this stage's part of a whole-model state."""

    def broadcast_own_state(self, root_rank: int) -> None:
        """Copy this stage's tensors and optimizer state from ``root_rank`` over the stage's set."""

    def statistics(self) -> list[Any]:
        """This stage's floating-point running statistics (BatchNorm), averaged by
        :meth:`GPipe.sync_model_buffers`."""

    def assign(self, tensors: list[Any], values: list[Any]) -> None:
        """Copy ``values`` into ``tensors`` in place."""

    def all_finite(self, values: Sequence[Any]) -> bool:
        """True if every floating-point value (tensor or array) in ``values`` is finite."""

    def read_checkpoint(self, directory: Path) -> dict[str, Any]:
        """The whole model's state from a checkpoint in the un-cut format (rank 0)."""

    def write_checkpoint(self, directory: Path, state: dict[str, Any]) -> None:
        """Write the whole model's ``state`` (every stage's part merged) in the un-cut format (rank 0)."""


class GPipe:
    """Runs the GPipe schedule, the update and the state movement of one rank's stage through
    ``stage``'s primitives. A data-parallel adapter holds one in ``adapter.pipeline`` when the run
    has pipeline stages (else None; :meth:`open` in its ``init``) and hands it the methods in
    :data:`PIPELINED` (:func:`pipelined`). ``stage`` is given here or made by :meth:`prepare`."""

    def __init__(self, placement: Placement, config: Any, stage: Stage | None = None, adapter: Any = None):
        self.placement, self.stage, self.adapter = placement, stage, adapter
        self.micro_batches = config.parallel.micro_batches
        self.grad_clip_norm = config.optim.grad_clip_norm
        self.nonfinite = config.train.nonfinite
        self._metric_keys: list[str] | None = None
        self._pending: dict[str, Any] | None = None  # a checkpoint rank 0 loaded, until broadcast_state
        self._gathered: list[dict[str, Any]] | None = None  # every stage's state on rank 0, until save_state

    @classmethod
    def open(cls, adapter: Any, hvd: Any, config: Any) -> "GPipe | None":
        """For ``adapter`` (right after ``hvd.init()``): the driver of this rank's place with
        ``parallel.pipeline_stages > 1``, its process sets opened (a collective); None without
        pipeline stages. ``hvd``: the framework's Horovod module."""
        if config.parallel.pipeline_stages <= 1:
            return None
        return cls(Placement.open(hvd, config.parallel.pipeline_stages), config, adapter=adapter)

    def prepare(self, task: Any, config: Any) -> None:
        """Cut ``task``'s model and make this rank's stage: the stage layer of the adapter's
        framework (:data:`STAGE_CLASSES`), given the adapter (device, batch transfer, skip counter).
        The adapter's ``task``, ``model`` and ``optimizer`` become the task's and the stage's (its
        own methods that stay, such as the learning rate's, use them)."""
        module, name = STAGE_CLASSES[self.adapter.name]
        self.stage = getattr(importlib.import_module(module), name)(self.adapter, task, config, self.placement)
        self.adapter.task, self.adapter.model, self.adapter.optimizer = task, task.model, self.stage.optimizer

    def context(self, ctx: Any) -> Any:
        """The adapter's ``ctx`` with this rank's replica (:meth:`Placement.context`)."""
        return self.placement.context(ctx)

    @property
    def layout(self) -> Layout:
        """The S x R grid."""
        return self.placement.layout

    # -- the schedule ---------------------------------------------------------------------------

    def _forward(self, inputs: Any, targets: Any, sizes: list[int], training: bool) -> dict[int, tuple[Any, Any]]:
        """The fill: returns, per micro-batch, what this stage's forward returned (``saved``, ``y``)."""
        stage, place = self.stage, self.placement
        s, stages, n = place.stage, self.layout.stages, sum(sizes)
        offsets = [sum(sizes[:m]) for m in range(len(sizes))]
        received: dict[int, Any] = {}
        results: dict[int, tuple[Any, Any]] = {}
        for t, row in enumerate(forward_ticks(stages, len(sizes))):
            m, payload = row[s], None
            if m is not None:
                lo, hi = offsets[m], offsets[m] + sizes[m]
                mb_inputs = slice_batch(inputs, lo, hi)
                x = mb_inputs if place.first else received.pop(m)
                results[m] = stage.forward(x, mb_inputs, targets[lo:hi], sizes[m] / n, training)
                if not place.last:
                    payload = stage.pack(results[m][1])
            if any(row[k] is not None for k in range(stages - 1)):  # someone sends this tick
                got = stage.alltoall(payload, s + 1 if payload is not None else None, f"hvdtrain.pipe.fwd.{t}")
                if not place.first and row[s - 1] is not None:
                    received[row[s - 1]] = stage.unpack(got, training)
        return results

    def _backward(self, results: dict[int, tuple[Any, Any]], sizes: list[int]) -> float:
        """The drain: every micro-batch's backward, in reverse; returns the last stage's loss summed
        over samples (0 elsewhere)."""
        stage, place = self.stage, self.placement
        s, stages = place.stage, self.layout.stages
        loss_sum = 0.0
        grads_in: dict[int, Any] = {}
        for t, row in enumerate(backward_ticks(stages, len(sizes))):
            m, payload = row[s], None
            if m is not None:
                saved, y = results.pop(m)
                loss, grad = stage.backward(saved, y, None if place.last else grads_in.pop(m))
                if place.last:
                    loss_sum += loss * sizes[m]
                if not place.first:
                    payload = stage.pack(grad)
            if any(row[k] is not None for k in range(1, stages)):  # someone sends this tick
                got = stage.alltoall(payload, s - 1 if payload is not None else None, f"hvdtrain.pipe.bwd.{t}")
                if not place.last and row[s + 1] is not None:
                    grads_in[row[s + 1]] = stage.unpack(got, False)
        return loss_sum

    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True, weight: float | None = None) -> float:
        """One optimizer step on this replica's batch (``apply_update`` and ``weight``, the
        adapter's accumulation arguments, do not apply: the micro-batches are the accumulation).
        Returns the batch's mean loss, the same on every stage of the replica."""
        inputs, targets, n = self.stage.begin(inputs, targets, training=True)
        sizes = split_sizes(n, self.micro_batches)
        loss_sum = self._backward(self._forward(inputs, targets, sizes, training=True), sizes)
        return self._update(loss_sum / n)

    def _update(self, loss: float) -> float:
        """Average over the stage's replicas, sum the norm and the loss over the replica, decide
        finite/clip, step."""
        stage, place = self.stage, self.placement
        grads = stage.gradients()
        if place.stage_set is not None and grads:  # average this stage over its replicas
            grads = stage.stage_average(grads, "hvdtrain.pipe.grads", compress=True)
        local = stage.norm(grads) if grads else 0.0
        squares, loss = stage.allreduce_sum([local ** 2, loss if place.last else 0.0], "hvdtrain.pipe.norm",
                                            place.replica_set)
        norm = squares ** 0.5
        if not math.isfinite(norm):
            stage.discard_gradients()
            if self.nonfinite == "error":
                raise NonFiniteGradientError(f"the allreduced gradient is not finite (norm {norm})")
            stage.count_skipped_update()
            return loss
        stage.apply(grads, self.grad_clip_norm if grads else None, norm)
        return loss

    def eval_step(self, inputs: Any, targets: Any) -> dict[str, float]:
        """Evaluation sums of this replica's batch: the last stage's, zeros under the same keys
        elsewhere."""
        stage, place = self.stage, self.placement
        inputs, targets, n = stage.begin(inputs, targets, training=False)
        results = self._forward(inputs, targets, [n], training=False)
        sums: dict[str, float] = {}
        if place.last:
            loss, metrics = stage.eval_sums(results[0][1], targets)
            sums = {"loss_sum": loss * n, "count": float(n), **metrics}
        if self._metric_keys is None:  # the other stages learn the keys once and report zeros
            root = self.layout.rank_of(self.layout.stages - 1, place.replica)
            self._metric_keys = stage.broadcast_object(sorted(sums), root, "hvdtrain.pipe.keys", place.replica_set)
        return {k: sums[k] for k in self._metric_keys} if place.last else {k: 0.0 for k in self._metric_keys}

    # -- state ----------------------------------------------------------------------------------

    def broadcast_state(self, root_rank: int = 0) -> None:
        """A checkpoint ``root_rank`` loaded reaches every stage (each takes its part); then each
        stage's replica 0 broadcasts the stage over the stage's set."""
        stage, place = self.stage, self.placement
        pending = stage.broadcast_object(self._pending, root_rank, "hvdtrain.pipe.restore", place.world_set)
        self._pending = None
        if pending is not None:
            stage.load_own_state(pending)
        if place.stage_set is not None:
            stage.broadcast_own_state(self.layout.rank_of(place.stage, 0))

    def sync_model_buffers(self) -> None:
        """This stage's running statistics averaged over the stage's replicas only."""
        stats = self.stage.statistics()
        if not stats or self.placement.stage_set is None:
            return
        name = f"hvdtrain.pipe.buffers.{self.placement.stage}"
        self.stage.assign(stats, self.stage.stage_average(stats, name, compress=False))

    def gather_state(self) -> None:
        """Collective before a checkpoint: replica 0's stages send their state to rank 0, in stage order."""
        stage, place = self.stage, self.placement
        if place.replica == 0:
            mine = stage.own_state()
            gathered = [mine]
            for s in range(1, self.layout.stages):  # stage s of replica 0 -> rank 0 (and its neighbours)
                got = stage.broadcast_object(mine if s == place.stage else None, self.layout.rank_of(s, 0),
                                             f"hvdtrain.pipe.gather.{s}", place.replica_set)
                if place.rank == 0:
                    gathered.append(got)
                del got  # the other stages drop it at once: at most their own state and one other
            self._gathered = gathered if place.rank == 0 else None
        # nobody leaves (a rank that exits shuts Horovod down) before rank 0 holds everything
        stage.allreduce_sum([0.0], "hvdtrain.pipe.gathered", place.world_set)

    def state_is_finite(self) -> bool:
        """True if every floating-point model value is finite: the gathered model on rank 0 after
        :meth:`gather_state`, else this stage's own."""
        parts = self._gathered or [self.stage.own_state()]
        return all(self.stage.all_finite(list(part["model"].values())) for part in parts)

    def save_state(self, directory: Path) -> None:
        """Rank 0, after :meth:`gather_state`: write the whole model in the un-cut format."""
        if self._gathered is None:
            raise RuntimeError("save_state on a pipeline stage without gather_state() first")
        if not self.state_is_finite():
            raise NonFiniteStateError("model parameters are not finite")
        state: dict[str, Any] = {"model": {}, "optimizer": {}, "groups": self._gathered[0]["groups"]}
        for part in self._gathered:
            state["model"].update(part["model"])
            state["optimizer"].update(part["optimizer"])
        self.stage.write_checkpoint(Path(directory), state)
        self._gathered = None

    def load_state(self, directory: Path) -> None:
        """Rank 0: read a checkpoint (un-cut format); :meth:`broadcast_state` hands it out."""
        self._pending = self.stage.read_checkpoint(Path(directory))

