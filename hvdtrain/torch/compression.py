"""The gradient exchanges for PyTorch on Horovod collectives (:mod:`hvdtrain.core.exchange`):
Horovod's allreduce, PowerSGD and top-k with error feedback, and local SGD (the algorithms are
described in :mod:`hvdtrain.core.compression`).

Every exchange is bound to the model's trainable parameters: :meth:`reduce` takes their local
gradients (``p.grad``, None where a parameter got none), leaves the gradient every rank applies in
each ``p.grad`` and returns those. :class:`Allreduce` is ``hvd.DistributedOptimizer`` (the
adapter's optimizer): its hooks start each allreduce during the backward pass and ``reduce`` waits
for them. With PowerSGD, top-k and local SGD the adapter's optimizer is the recipe's own and the
gradients accumulate locally over micro-batches (nothing is sent during the backward pass).
:class:`PowerSGD` and :class:`TopK` are the compressors (plain lists of tensors in and out);
:class:`Compressed` binds one to the parameters.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from hvdtrain.core.compression import CommPlan, averaging_due, compressible, effective_rank, initial_q, \
    matrix_shape, topk_count
from hvdtrain.core.exchange import Stateless, indexed, replica_key, state_format

EPSILON = 1e-8  # keeps Gram-Schmidt finite on an all-zero column


def gram_schmidt(matrix: torch.Tensor) -> torch.Tensor:
    """Orthonormalise the columns of ``matrix`` in place and return it: modified Gram-Schmidt, column
    by column as PyTorch's ``powerSGD_hook``, run twice ("twice is enough"), which keeps the columns
    orthonormal to float precision even when ``matrix`` is ill-conditioned (the hook uses
    Householder QR above rank 2 for the same reason)."""
    for _ in range(2):
        for i in range(matrix.shape[1]):
            col = matrix[:, i:i + 1]
            col.div_(torch.linalg.vector_norm(col) + EPSILON)
            if i + 1 < matrix.shape[1]:
                rest = matrix[:, i + 1:]
                rest.sub_(col @ (col.t() @ rest))
    return matrix


def _to_numpy(tensors: dict[Any, torch.Tensor], prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}{k}": t.detach().cpu().numpy().copy() for k, t in tensors.items()}


def _from_numpy(state: dict[str, np.ndarray], prefix: str, device: torch.device) -> dict[int, torch.Tensor]:
    return {int(k[len(prefix):]): torch.from_numpy(np.array(v)).to(device)
            for k, v in state.items() if k.startswith(prefix)}


class PowerSGD:
    """Rank-r PowerSGD with error feedback and warm-started Q for a fixed list of gradients."""

    def __init__(self, plan: CommPlan) -> None:
        self.plan = plan
        self.compression = hvd.Compression.fp16 if plan.fp16_wire else hvd.Compression.none
        self.reset()

    def reset(self) -> None:
        """Forget error buffers, Q matrices and the step count (a new world size, a new start)."""
        self.steps = 0
        self.q: dict[int, torch.Tensor] = {}
        self.error: dict[int, torch.Tensor] = {}

    def reduce(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """The averaged (and, after the warm-up, compressed) gradients, in the same order and shapes."""
        self.steps += 1
        if self.steps <= self.plan.powersgd_start_step:
            return hvd.grouped_allreduce(grads, op=hvd.Average, compression=self.compression,  # distributed
                                         name="hvdtrain.powersgd.warmup")
        plain = [i for i, g in enumerate(grads) if not compressible(tuple(g.shape), self.plan)]
        packed = [i for i, g in enumerate(grads) if compressible(tuple(g.shape), self.plan)]
        matrices, ps = {}, []
        for j, i in enumerate(packed):
            n, m = matrix_shape(tuple(grads[i].shape))
            r = effective_rank(n, m, self.plan.powersgd_rank)
            matrix = grads[i].detach().reshape(n, m).float()
            if i in self.error:
                matrix = matrix + self.error[i]
            if i not in self.q:
                self.q[i] = torch.from_numpy(initial_q(j, m, r)).to(matrix.device)
            matrices[i] = matrix
            ps.append(matrix @ gram_schmidt(self.q[i]))  # Q orthonormalised (in place), as the hook does
        reduced = hvd.grouped_allreduce([grads[i] for i in plain] + ps, op=hvd.Average,  # distributed: P's
                                        compression=self.compression, name="hvdtrain.powersgd.p")
        out: list[Any] = [None] * len(grads)
        for i, tensor in zip(plain, reduced[:len(plain)]):
            out[i] = tensor
        ps = [gram_schmidt(p.float().contiguous()) for p in reduced[len(plain):]]
        qs = [matrices[i].t() @ p for i, p in zip(packed, ps)]
        if qs:
            qs = hvd.grouped_allreduce(qs, op=hvd.Average, compression=self.compression,  # distributed: Q's
                                       name="hvdtrain.powersgd.q")
        for i, p, q in zip(packed, ps, qs):
            q = q.float()
            approx = p @ q.t()
            self.error[i] = matrices[i] - approx
            self.q[i] = q
            out[i] = approx.reshape(grads[i].shape).to(grads[i].dtype)
        return out

    def state(self) -> dict[str, np.ndarray]:
        """Step count, Q matrices and this rank's error buffers as NumPy arrays."""
        return {"steps": np.asarray(self.steps), **_to_numpy(self.q, "q/"), **_to_numpy(self.error, "error/")}

    def load_state(self, state: dict[str, np.ndarray], device: torch.device) -> None:
        """Put back what :meth:`state` returned."""
        self.steps = int(state["steps"])
        self.q, self.error = _from_numpy(state, "q/", device), _from_numpy(state, "error/", device)


class TopK:
    """Top-k sparsification with error feedback, exchanged with two allgathers (values, indices)."""

    def __init__(self, plan: CommPlan) -> None:
        self.plan = plan
        self.reset()

    def reset(self) -> None:
        """Forget the error buffers."""
        self.steps = 0
        self.error: dict[int, torch.Tensor] = {}

    def reduce(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """The average over ranks of every rank's k largest-magnitude entries (error added)."""
        self.steps += 1
        flats, values, indices, offset = [], [], [], 0
        for i, g in enumerate(grads):
            flat = g.detach().reshape(-1).float()
            if i in self.error:
                flat = flat + self.error[i]
            k = topk_count(flat.numel(), self.plan.topk_ratio)
            index = torch.topk(flat.abs(), k, sorted=False).indices
            value = flat[index]
            if self.plan.fp16_wire:
                value = value.half()
            residual = flat.clone()
            residual[index] -= value.float()  # what was not sent (fp16 rounding included)
            self.error[i] = residual
            flats.append(flat)
            values.append(value)
            indices.append(index + offset)
            offset += flat.numel()
        index_dtype = torch.int32 if offset < 2 ** 31 else torch.int64
        handles = (hvd.allgather_async(torch.cat(values), name="hvdtrain.topk.values"),  # distributed
                   hvd.allgather_async(torch.cat(indices).to(index_dtype), name="hvdtrain.topk.indices"))
        all_values, all_indices = (hvd.synchronize(h) for h in handles)
        total = torch.zeros(offset, dtype=torch.float32, device=flats[0].device if flats else None)
        total.index_add_(0, all_indices.long(), all_values.float())
        total.div_(hvd.size())
        out, start = [], 0
        for g in grads:
            out.append(total[start:start + g.numel()].reshape(g.shape).to(g.dtype))
            start += g.numel()
        return out

    def state(self) -> dict[str, np.ndarray]:
        """Step count and this rank's error buffers."""
        return {"steps": np.asarray(self.steps), **_to_numpy(self.error, "error/")}

    def load_state(self, state: dict[str, np.ndarray], device: torch.device) -> None:
        """Put back what :meth:`state` returned."""
        self.steps = int(state["steps"])
        self.error = _from_numpy(state, "error/", device)


def _to_array(tensor: torch.Tensor) -> np.ndarray:
    """A tensor as a NumPy array (bfloat16, which NumPy lacks, as its int16 bits)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().copy()


@torch.no_grad()
def _assign(target: torch.Tensor, array: np.ndarray) -> None:
    """Copy ``array`` (from :func:`_to_array`) into ``target`` in place."""
    source = torch.from_numpy(np.array(array))
    if target.dtype == torch.bfloat16 and source.dtype == torch.int16:
        source = source.view(torch.bfloat16)
    target.copy_(source.reshape(target.shape))


def _model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every tensor of the model's state dict, in its order (buffers included)."""
    return list(model.state_dict().values())


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's per-parameter state tensors: parameters in group order, keys sorted."""
    tensors = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            param_state = optimizer.state.get(p, {})
            tensors += [param_state[k] for k in sorted(param_state) if torch.is_tensor(param_state[k])]
    return tensors


def _float_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer, with_optimizer: bool) -> list:
    tensors = [t for t in model.state_dict().values() if t.is_floating_point()]
    if with_optimizer:
        for param_state in optimizer.state.values():
            tensors += [t for t in param_state.values() if torch.is_tensor(t) and t.is_floating_point()]
    return tensors


class Allreduce(Stateless):
    """Horovod's allreduce (average or Adasum, optional float16 on the wire) through
    ``hvd.DistributedOptimizer``, whose hooks start each gradient's allreduce during the backward
    pass. ``optimizer`` is that ``DistributedOptimizer``, the adapter's optimizer."""

    def __init__(self, optimizer: Any, params: list[torch.Tensor]) -> None:
        self.optimizer, self.params = optimizer, params

    def reduce(self, grads: list[Any]) -> list[Any]:
        """Wait for the allreduces the backward pass started (``synchronize()``); the averaged
        gradients are in each ``p.grad`` (zeros where a parameter got none)."""
        self.optimizer.synchronize()  # distributed
        return [p.grad for p in self.params]

    def stepping(self) -> contextlib.AbstractContextManager:
        """Around ``optimizer.step()``: the gradients are reduced already."""
        return self.optimizer.skip_synchronize()

    def restart(self, accumulation: int) -> None:
        """An elastic sync: the hooks start the allreduces after ``accumulation`` backward passes."""
        self.optimizer.set_backward_passes_per_step(accumulation)


class AdasumUpdates(Allreduce):
    """Horovod's Adasum in torch, which combines each worker's optimizer *update*, not its
    gradient: the hooks of ``hvd.DistributedOptimizer(op=hvd.Adasum)`` (``optimizer``) compute each
    parameter's local update during the backward pass and start its Adasum reduction, and that
    optimizer's own ``step()`` waits for them and applies the combined update. So there is no
    reduced gradient to hand back before the step (the rulebook refuses ``optim.grad_clip_norm``
    and fp16 gradient scaling with Adasum for that reason), and nothing to skip around it."""

    def reduce(self, grads: list[Any]) -> list[Any]:
        """No gradient is reduced: Adasum reduces the updates inside the step (empty list)."""
        return []

    def stepping(self) -> contextlib.AbstractContextManager:
        """Around ``optimizer.step()``: Horovod's Adasum step is the collective, so nothing is skipped."""
        return contextlib.nullcontext()


class Compressed:
    """A compressor (:class:`PowerSGD`, :class:`TopK`) exchanging the parameters' gradients."""

    keeps_state = True
    buffers_agree = False  # the ranks' running statistics differ: sync_model_buffers averages them

    def __init__(self, compressor: Any, params: list[torch.Tensor]) -> None:
        self.compressor, self.params, self.plan = compressor, params, compressor.plan

    @torch.no_grad()
    def reduce(self, grads: list[Any]) -> list[Any]:
        """Replace each parameter's local gradient by the exchanged one (every rank, once per update)."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for p, g in zip(self.params, self.compressor.reduce([p.grad for p in self.params])):
            p.grad.copy_(g)
        return [p.grad for p in self.params]

    def stepping(self) -> contextlib.AbstractContextManager:
        """Nothing to skip: the optimizer is the recipe's own."""
        return contextlib.nullcontext()

    def after_update(self) -> None:
        """Nothing to do."""

    def sync_replicas(self) -> None:
        """The replicas are always equal."""

    def state(self) -> dict[str, np.ndarray]:
        """``steps``, ``q/<i>``, ``error/<i>`` (:mod:`hvdtrain.core.exchange`)."""
        return self.compressor.state()

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Put back what :meth:`state` returned (formats 1 and 2 are the same here)."""
        self.compressor.load_state(state, self.params[0].device if self.params else torch.device("cpu"))

    def restart(self, accumulation: int) -> None:
        """An elastic sync: nothing counts the micro-batches here (they accumulate locally)."""
        return None  # a body besides the docstring, as in Stateless.after_update

    def reset(self) -> None:
        """Forget error buffers, Q matrices and the step count."""
        self.compressor.reset()


class LocalSGD:
    """Periodic averaging of the model (and optionally the optimizer state) in one grouped allreduce;
    each rank applies its own gradients in between."""

    keeps_state = True
    buffers_agree = False  # the ranks' running statistics differ: sync_model_buffers averages them

    def __init__(self, plan: CommPlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.plan, self.model, self.optimizer = plan, model, optimizer
        self.reset()

    def restart(self, accumulation: int) -> None:
        """An elastic sync: nothing counts the micro-batches here (they accumulate locally)."""
        return None  # a body besides the docstring, as in Stateless.after_update

    def reset(self) -> None:
        """Start a new averaging period (the replicas are equal: just broadcast or averaged)."""
        self.since_average = 0

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The local gradients themselves: nothing is sent."""
        return grads

    def stepping(self) -> contextlib.AbstractContextManager:
        """Nothing to skip: the optimizer is the recipe's own."""
        return contextlib.nullcontext()

    def after_update(self) -> None:
        """Count one local update; average when ``comm.local_sgd_steps`` have been taken."""
        self.since_average += 1
        if averaging_due(self.since_average, self.plan):
            self.average()

    def sync_replicas(self) -> None:
        """Average now (before an evaluation) unless the replicas were just averaged."""
        self.average()

    @torch.no_grad()
    def average(self) -> None:
        """Average every floating-point model tensor (buffers included) and, if configured, the
        optimizer state across ranks, in place; a no-op right after an averaging."""
        if self.since_average == 0:
            return
        tensors = _float_tensors(self.model, self.optimizer, self.plan.local_sgd_average_optimizer)
        averaged = hvd.grouped_allreduce(tensors, op=hvd.Average, name="hvdtrain.local_sgd")  # distributed
        for tensor, mean in zip(tensors, averaged):
            tensor.copy_(mean)
        self.since_average = 0

    def state(self) -> dict[str, np.ndarray]:
        """The period's position and, between averagings, this rank's own model and optimizer
        tensors (the optimizer's also right after an averaging that left it out)."""
        state = {"since_average": np.asarray(self.since_average)}
        if self.since_average:
            state.update({replica_key("model", i): _to_array(t) for i, t in enumerate(_model_tensors(self.model))})
        if self.since_average or not self.plan.local_sgd_average_optimizer:
            state.update({replica_key("optimizer", i): _to_array(t)
                          for i, t in enumerate(_optimizer_tensors(self.optimizer))})
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Put back what :meth:`state` returned; format 1 kept the replica as one ``torch.save``
        blob (``replica``)."""
        self.since_average = int(state["since_average"])
        if state_format(state) == 1:
            if "replica" in state:
                device = next(self.model.parameters()).device
                replica = torch.load(io.BytesIO(state["replica"].tobytes()), map_location=device, weights_only=True)
                if "model" in replica:
                    self.model.load_state_dict(replica["model"])
                self.optimizer.load_state_dict(replica["optimizer"])
            return
        for kind, tensors in (("model", _model_tensors(self.model)), ("optimizer", _optimizer_tensors(self.optimizer))):
            saved = indexed(state, f"{kind}/")
            if saved and len(saved) != len(tensors):
                raise ValueError(f"the local-SGD state holds {len(saved)} {kind} tensors, this run has {len(tensors)}")
            for i, array in saved.items():
                _assign(tensors[i], array)


def build_exchange(plan: CommPlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """hvdtrain's own exchange for ``plan`` (from :func:`hvdtrain.core.compression.comm_plan`)
    around the recipe's ``optimizer``; Horovod's is :class:`Allreduce`."""
    params = [p for p in model.parameters() if p.requires_grad]
    if plan.method == "powersgd":
        return Compressed(PowerSGD(plan), params)
    if plan.method == "topk":
        return Compressed(TopK(plan), params)
    return LocalSGD(plan, model, optimizer)
