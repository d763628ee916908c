"""PyTorch's exchange factory: the objects an :class:`~hvdtrain.core.exchange_plan.ExchangePlan` names.

:func:`build` turns the plan (decided once, by :func:`hvdtrain.core.exchange_plan.plan_exchange`)
into a :class:`Wiring`: the optimizer the adapter steps, the gradient exchange
(:mod:`hvdtrain.core.exchange`) and the optimizer's state keeper, which answers the few questions
whose answer differs when the optimizer state is sharded (:class:`WholeState` for every exchange but
ZeRO's, :class:`ShardedState` for ZeRO-1, :class:`ShardedGradients` for ZeRO-2). The adapter
(:class:`~hvdtrain.torch.adapter.TorchAdapter`) and :func:`hvdtrain.torch.prepare.prepare` hold the
result and call it; neither branches on the kind.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import horovod.torch as hvd
import torch

from hvdtrain.core.exchange_plan import ExchangePlan
from hvdtrain.torch import reproducible as bitwise
from hvdtrain.torch.compression import AdasumUpdates, Allreduce, build_exchange
from hvdtrain.torch.flat_buffers import FlatAllreduce, GradBuffers, dtype_layouts
from hvdtrain.torch.sharded import FlatReduceScatter, ShardedOptimizer, zero1_exchange


class WholeState:
    """Every rank holds the optimizer's whole state (data parallelism, compression, local SGD,
    bitwise mode). Stateless: the objects come as arguments, so one instance serves any adapter."""

    def scheduled(self, optimizer: Any) -> Any:
        """The optimizer whose parameter groups the task's LR scheduler drives: the one that runs
        (``hvd.DistributedOptimizer`` shares the recipe optimizer's groups until a load replaces them)."""
        return optimizer

    def hyperparameter_groups(self, optimizer: Any) -> list[dict[str, Any]]:
        """The parameter groups whose settings rank 0 loaded and every rank takes."""
        return optimizer.param_groups

    def broadcast(self, model: torch.nn.Module, optimizer: Any, root_rank: int,
                  broadcast_object: Callable[[Any, int], Any]) -> None:
        """Model parameters and the whole optimizer state from ``root_rank`` (a collective).

        Horovod creates missing optimizer state with one zero-gradient step; LR 0 makes that step
        leave the weights alone. It still counts as a step (Adam's bias correction would start at
        step 2, shrinking the first update to about 0.74 of its size) and coupled weight decay would
        seed the moments, so when rank 0 has no state yet (a fresh start) the state that step
        created is dropped again afterwards: every optimizer starts as a fresh one would. The step
        fires no step hook, and the groups' hyperparameters are put back after it."""
        fresh = broadcast_object(len(optimizer.state) == 0, root_rank)  # distributed
        kept = group_settings(optimizer.param_groups)
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        with _hooks_off(optimizer):
            hvd.broadcast_optimizer_state(optimizer, root_rank=root_rank)  # distributed
        for group, values in zip(optimizer.param_groups, kept):
            group.update(values)
        if fresh:
            optimizer.state.clear()
            optimizer.zero_grad()
        hvd.broadcast_parameters(model.state_dict(), root_rank=root_rank)  # distributed

    def gather(self) -> None:
        """Before rank 0 saves: nothing to bring together."""

    def before_backward(self) -> None:
        """Before a backward pass: the gradients go where autograd puts them."""

    def global_norm(self, local: torch.Tensor) -> torch.Tensor:
        """The norm of the whole gradient: this rank holds all of it."""
        return local

    def agree_on_overflow(self, scaler: Any) -> None:
        """fp16: every rank's loss scaler saw the whole gradient, so they agree already."""


class ShardedState(WholeState):
    """ZeRO-1 (:class:`~hvdtrain.torch.sharded.ShardedOptimizer`): each rank keeps 1/N of the
    optimizer state; the gradients, averaged whole, live in flat buffers."""

    def __init__(self, optimizer: ShardedOptimizer) -> None:
        self.optimizer = optimizer

    def scheduled(self, optimizer: Any) -> Any:
        """The groups in force: the shard optimizer's (ZeRO-2) or the recipe optimizer's (ZeRO-1)."""
        return self.optimizer.inner if self.optimizer.gradients else self.optimizer.optimizer

    def hyperparameter_groups(self, optimizer: Any) -> list[dict[str, Any]]:
        """The recipe optimizer's (what rank 0 loaded; the broadcast copies them to the shards)."""
        return self.optimizer.optimizer.param_groups

    def broadcast(self, model: torch.nn.Module, optimizer: Any, root_rank: int,
                  broadcast_object: Callable[[Any, int], Any]) -> None:
        """The parameters, then each rank keeps its slice of the root's whole optimizer state."""
        hvd.broadcast_parameters(model.state_dict(), root_rank=root_rank)  # distributed
        self.optimizer.broadcast(root_rank)  # distributed

    def gather(self) -> None:
        """Rank 0 holds the whole optimizer state to save (a collective)."""
        self.optimizer.gather()  # distributed

    def before_backward(self) -> None:
        """Every ``p.grad`` a view of its group's flat buffer (ZeRO-2 freed them after the exchange)."""
        self.optimizer.attach_grads()


class ShardedGradients(ShardedState):
    """ZeRO-2: each rank also keeps only its slice of the averaged gradient
    (:class:`~hvdtrain.torch.sharded.FlatReduceScatter`), so the norm and the loss scaler's
    overflow finding are agreed across ranks."""

    def __init__(self, optimizer: ShardedOptimizer, exchange: FlatReduceScatter) -> None:
        super().__init__(optimizer)
        self.exchange = exchange

    def global_norm(self, local: torch.Tensor) -> torch.Tensor:
        """The squared shard norms summed across ranks (a collective)."""
        return self.exchange.global_norm(local)  # distributed

    def agree_on_overflow(self, scaler: Any) -> None:
        """Every rank skips (or applies) the update alike (a collective)."""
        self.exchange.agree_on_overflow(scaler)  # distributed


@dataclass
class Wiring:
    """What :func:`build` makes: the optimizer the adapter steps, the exchange, the state keeper."""

    optimizer: Any
    exchange: Any
    state: WholeState


def build(plan: ExchangePlan, config: Any, model: torch.nn.Module, params: list[torch.Tensor],
          optimizer: torch.optim.Optimizer) -> Wiring:
    """The objects ``plan`` names around the recipe's ``optimizer`` (``params``: the model's
    trainable parameters, in order)."""
    compression = hvd.Compression.fp16 if plan.fp16_wire else hvd.Compression.none
    accumulation = config.train.grad_accumulation
    if plan.kind == "bitwise":  # hvdtrain.torch.reproducible: one fixed tree, any world size
        bitwise.enter(config)
        return Wiring(optimizer, bitwise.TreeExchange(model, params, accumulation), WholeState())
    if plan.kind == "zero1":
        sharded = ShardedOptimizer(optimizer, gradients=False)
        return Wiring(sharded, zero1_exchange(sharded, compression), ShardedState(sharded))
    if plan.kind == "zero2":
        sharded = ShardedOptimizer(optimizer, gradients=True)
        scatter = FlatReduceScatter(sharded, compression)
        return Wiring(sharded, scatter, ShardedGradients(sharded, scatter))
    if plan.comm is not None:  # PowerSGD, top-k, local SGD around the recipe's own optimizer
        return Wiring(optimizer, build_exchange(plan.comm, model, optimizer), WholeState())
    if plan.kind == "flat":  # one flat buffer per dtype, averaged in place once per update
        buffers = GradBuffers(dtype_layouts(params, optimizer))
        return Wiring(optimizer, FlatAllreduce(buffers, params, compression, owns_zeroing=True), WholeState())
    distributed = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=compression, backward_passes_per_step=accumulation,
        op=hvd.Adasum if plan.adasum else hvd.Average,
        # groups=1 makes this constructor a collective (it broadcasts the parameter order): a worker
        # joining an elastic job builds its optimizer alone, so elastic runs keep per-tensor groups.
        groups=None if plan.overlap or config.train.elastic else 1)
    return Wiring(distributed, (AdasumUpdates if plan.adasum else Allreduce)(distributed, params), WholeState())


def group_settings(param_groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each optimizer group's settings (LR, momentum, ...) without its parameter list."""
    return [{k: v for k, v in g.items() if k != "params"} for g in param_groups]


@contextlib.contextmanager
def _hooks_off(optimizer: torch.optim.Optimizer):
    """No optimizer step hook (the optimizer's own or a global one) fires inside: the state-creating
    step at start-up is not one of the task's updates."""
    from torch.optim import optimizer as module

    own = [getattr(optimizer, name) for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")]
    shared = [getattr(module, name) for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")]
    saved = [dict(hooks) for hooks in own + shared]
    for hooks in own + shared:
        hooks.clear()
    try:
        yield
    finally:
        for hooks, entries in zip(own + shared, saved):
            hooks.update(entries)
