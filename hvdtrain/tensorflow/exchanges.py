"""TensorFlow's exchange factory: the objects an :class:`~hvdtrain.core.exchange_plan.ExchangePlan` names.

:func:`build` turns the plan (decided once, by :func:`hvdtrain.core.exchange_plan.plan_exchange`)
into a :class:`Wiring`: the gradient exchange (:mod:`hvdtrain.core.exchange`), the function that
runs one micro-batch, the accumulators of the local gradients over an update's micro-batches, and
the optimizer's state keeper,
which answers what differs when the optimizer state is sharded (:class:`WholeState`, or
:class:`ShardedState` over :class:`~hvdtrain.tensorflow.sharded.ShardedOptimizer`). The adapter
(:class:`~hvdtrain.tensorflow.adapter.TensorFlowAdapter`) holds the result and never branches on the
kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdtrain.core import batching
from hvdtrain.core.exchange_plan import ExchangePlan
from hvdtrain.tensorflow import reproducible as bitwise
from hvdtrain.tensorflow.compression import Allreduce, build_exchange, tf_variables
from hvdtrain.tensorflow.sharded import ShardedExchange, ShardedOptimizer


class WholeState:
    """Every rank holds the optimizer's whole state (all exchanges but ZeRO's). Stateless: the
    objects come as arguments, so one instance serves any adapter (pipeline stages too)."""

    def build(self, optimizer: Any, variables: list[Any]) -> None:
        """Create the optimizer's slots now, so that they can be broadcast."""
        optimizer.build(variables)

    def update_target(self, variables: list[Any], optimizer: Any) -> tuple[list[Any], Any]:
        """The variables the update applies the exchanged gradients to, and the optimizer that does."""
        return variables, optimizer

    def global_norm(self, grads: list[Any]) -> Any:
        """The norm of the whole gradient (graph ops): this rank holds all of it."""
        return tf.linalg.global_norm(grads)

    def after_update(self) -> None:
        """After the update, inside the step's graph: nothing."""
        return None  # a body besides the docstring: the traced step calls it

    def graph_learning_rate(self, optimizer: Any) -> Any:
        """The optimizer's LR variable the traced step assigns (None: set eagerly)."""
        lr = optimizer.learning_rate
        return lr if isinstance(lr, keras.Variable) else None

    def learning_rate_owner(self, optimizer: Any) -> Any:
        """The optimizer whose learning rate the next update uses."""
        return optimizer

    def set_learning_rate(self, lr: float) -> None:
        """Nothing besides the adapter's optimizer."""

    def broadcast(self, model: Any, optimizer: Any, root_rank: int) -> None:
        """Model and optimizer variables from ``root_rank`` (a collective)."""
        variables = tf_variables(model.variables) + tf_variables(optimizer.variables)
        hvd.broadcast_variables(variables, root_rank=root_rank)  # distributed: model + optimizer state

    def gather(self) -> None:
        """Before rank 0 saves: nothing to bring together."""

    def optimizer_variables(self, optimizer: Any, checkpoint: bool = False) -> list[Any]:
        """The optimizer's variables, in memory and in a checkpoint alike."""
        return optimizer.variables

    def after_save(self) -> None:
        """After saving (or failing to): nothing held."""


class ShardedState(WholeState):
    """ZeRO-1 and ZeRO-2: each rank keeps 1/N of the optimizer state and updates its slices of the
    parameters (:class:`~hvdtrain.tensorflow.sharded.ShardedOptimizer`)."""

    def __init__(self, sharded: ShardedOptimizer) -> None:
        self.sharded = sharded

    def build(self, optimizer: Any, variables: list[Any]) -> None:
        """The shard optimizer built its own slots (1/N of them)."""

    def update_target(self, variables: list[Any], optimizer: Any) -> tuple[list[Any], Any]:
        """This rank's slices of the parameters, and the shard optimizer."""
        return self.sharded.shards, self.sharded.inner

    def global_norm(self, grads: list[Any]) -> Any:
        """Every rank's slices' squares summed (a scalar allreduce, graph ops)."""
        return self.sharded.global_norm(grads)  # distributed

    def after_update(self) -> None:
        """The updated slices make the whole model on every rank (graph ops, a collective)."""
        self.sharded.gather()  # distributed

    def graph_learning_rate(self, optimizer: Any) -> Any:
        """None: the shard optimizer's LR is set eagerly (:meth:`set_learning_rate`)."""
        return None

    def learning_rate_owner(self, optimizer: Any) -> Any:
        """The shard optimizer."""
        return self.sharded.inner

    def set_learning_rate(self, lr: float) -> None:
        """Into the shard optimizer too."""
        self.sharded.set_learning_rate(lr)

    def broadcast(self, model: Any, optimizer: Any, root_rank: int) -> None:
        """The model's variables, then each rank keeps its slice of the root's optimizer state."""
        hvd.broadcast_variables(tf_variables(model.variables), root_rank=root_rank)  # distributed
        self.sharded.broadcast(root_rank)  # distributed

    def gather(self) -> None:
        """Rank 0 holds the whole optimizer state to save (a collective)."""
        self.sharded.collect()  # distributed

    def optimizer_variables(self, optimizer: Any, checkpoint: bool = False) -> list[Any]:
        """In a checkpoint the whole state in data parallelism's layout
        (:meth:`ShardedOptimizer.checkpoint_variables`), in memory this rank's."""
        return self.sharded.checkpoint_variables() if checkpoint else self.sharded.variables()

    def after_save(self) -> None:
        """The slots not saved still come (every rank alike; a collective)."""
        self.sharded.release()  # distributed


@dataclass
class Wiring:
    """What :func:`build` makes (see the module docstring). ``train_step(inputs, targets,
    apply_update, weight)`` runs one micro-batch."""

    exchange: Any
    state: WholeState
    train_step: Callable[..., Any]
    accumulators: list[Any]


def build(plan: ExchangePlan, config: Any, adapter: Any) -> Wiring:
    """The objects ``plan`` names for ``adapter`` (its ``model``, ``optimizer`` and
    ``inner_optimizer``, ``trainable`` variables and ``buffers`` set; its fine-tuning controls too).
    The optimizer's slots are created here (whole, or the shard optimizer's 1/N)."""
    variables, accumulation = adapter.trainable, config.train.grad_accumulation
    if plan.kind == "bitwise":  # hvdtrain.tensorflow.reproducible: one fixed tree, each micro-batch exchanged
        state = WholeState()
        state.build(adapter.optimizer, variables)
        exchange = bitwise.TreeExchange(adapter, accumulation)
        return Wiring(exchange, state, bitwise_step(exchange, adapter), [])  # the tree sums the micro-batches
    if plan.sharded:  # the optimizer state and its update in 1/N slices
        sharded = ShardedOptimizer(adapter.inner_optimizer, adapter.optimizer, variables,
                                   config.parallel.shard_optimizer)
        state = ShardedState(sharded)
        exchange = ShardedExchange(sharded, variables, hvd.Compression.fp16 if plan.fp16_wire else hvd.Compression.none)
    else:
        state = WholeState()
        state.build(adapter.optimizer, variables)
        exchange = _data_parallel(plan, adapter, accumulation)
    # the local sums of an update's micro-batches (also when an elastic re-form may give this worker more)
    accumulators = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tf_variables(variables)] \
        if accumulation > 1 or batching.may_reform(config) else []
    return Wiring(exchange, state, adapter.graph_train_step, accumulators)


def _data_parallel(plan: ExchangePlan, adapter: Any, accumulation: int) -> Any:
    """The adapter's data-parallel exchange (:func:`data_parallel`): without accumulation, an
    overlapped allreduce reduces each gradient as soon as it exists, else one fused allreduce."""
    groups = None if plan.overlap and accumulation == 1 else 1
    return data_parallel(plan, adapter.trainable, adapter.model, adapter.optimizer, groups)


def data_parallel(plan: ExchangePlan, variables: list[Any], model: Any, optimizer: Any, groups: int | None) -> Any:
    """The exchange of a data-parallel ``plan`` (every kind but bitwise and ZeRO's) for the gradients
    of ``variables``: Horovod's allreduce (what ``DistributedGradientTape`` runs; ``groups`` 1 fuses
    all gradients into one grouped allreduce, None reduces each as soon as it exists), or hvdtrain's
    PowerSGD, top-k or local SGD (``model``'s ``variables`` and ``optimizer``'s averaged every
    ``comm.local_sgd_steps`` updates). The Trainer's adapter and :mod:`hvdtrain.keras`'s optimizer
    both build theirs here."""
    if plan.comm is not None:
        return build_exchange(plan.comm, variables, model, optimizer)
    # Horovod 0.28.1's grouped_allreduce fails with Adasum ("'tensor' is used before assignment"),
    # so Adasum reduces tensor by tensor.
    return Allreduce(variables, hvd.Compression.fp16 if plan.fp16_wire else hvd.Compression.none,
                     hvd.Adasum if plan.adasum else hvd.Average, None if plan.adasum else groups)


def bitwise_step(exchange: Any, adapter: Any) -> Callable[..., Any]:
    """Bitwise mode's micro-batch: the exchange runs each one (its gradient row into the tree)."""
    def train_step(inputs: Any, targets: Any, apply_update: bool = True, weight: float | None = None) -> Any:
        return exchange.train_step(adapter.as_batch(inputs), tf.convert_to_tensor(targets), apply_update,
                                   1.0 / adapter.accumulation if weight is None else weight)

    return train_step
