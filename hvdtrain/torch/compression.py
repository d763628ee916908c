"""PowerSGD and top-k gradient compression with error feedback, and local SGD, for PyTorch on
Horovod collectives (the algorithms are described in :mod:`hvdtrain.core.compression`).

:class:`ExchangeOptimizer` stands where ``hvd.DistributedOptimizer`` stands otherwise: the same
``synchronize()`` / ``skip_synchronize()`` / ``step()`` / ``zero_grad()`` calls, so the adapter's
update code is unchanged. Gradients accumulate locally over micro-batches (nothing is sent
during the backward pass); ``synchronize()`` runs the compressed exchange once per update and
leaves the averaged gradient in each ``p.grad``. Under local SGD it sends nothing, and the update's
end (``zero_grad()``, which every rank reaches even when it skipped a non-finite step) averages
the model every ``comm.local_sgd_steps`` updates.
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


def _float_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer, with_optimizer: bool) -> list:
    tensors = [t for t in model.state_dict().values() if t.is_floating_point()]
    if with_optimizer:
        for param_state in optimizer.state.values():
            tensors += [t for t in param_state.values() if torch.is_tensor(t) and t.is_floating_point()]
    return tensors


class LocalSGD:
    """Periodic averaging of the model (and optionally the optimizer state) in one grouped allreduce."""

    def __init__(self, plan: CommPlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.plan, self.model, self.optimizer = plan, model, optimizer
        self.reset()

    def reset(self) -> None:
        """Start a new averaging period (the replicas are equal: just broadcast or averaged)."""
        self.since_average = 0

    def after_update(self) -> None:
        """Count one local update; average when ``comm.local_sgd_steps`` have been taken."""
        self.since_average += 1
        if averaging_due(self.since_average, self.plan):
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
        """The period's position and, between averagings, this rank's own model and optimizer state."""
        state = {"since_average": np.asarray(self.since_average)}
        if self.since_average:
            buffer = io.BytesIO()
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, buffer)
            state["replica"] = np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy()
        elif not self.plan.local_sgd_average_optimizer:
            buffer = io.BytesIO()
            torch.save({"optimizer": self.optimizer.state_dict()}, buffer)
            state["replica"] = np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy()
        return state

    def load_state(self, state: dict[str, np.ndarray], device: torch.device) -> None:
        """Put back what :meth:`state` returned."""
        self.since_average = int(state["since_average"])
        if "replica" in state:
            replica = torch.load(io.BytesIO(state["replica"].tobytes()), map_location=device, weights_only=True)
            if "model" in replica:
                self.model.load_state_dict(replica["model"])
            self.optimizer.load_state_dict(replica["optimizer"])


class ExchangeOptimizer:
    """A torch optimizer whose gradients are exchanged by hvdtrain (PowerSGD, top-k) or not at all
    (local SGD), with the calls of ``hvd.DistributedOptimizer`` that the adapter uses. Everything
    else (``param_groups``, ``state``, ``state_dict``...) is the wrapped optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, plan: CommPlan) -> None:
        self.optimizer, self.model, self.plan = optimizer, model, plan
        self.params = [p for p in model.parameters() if p.requires_grad]
        if plan.method == "powersgd":
            self.exchange: Any = PowerSGD(plan)
        elif plan.method == "topk":
            self.exchange = TopK(plan)
        else:
            self.exchange = LocalSGD(plan, model, optimizer)
        self._update_pending = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["optimizer"], name)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @torch.no_grad()
    def synchronize(self) -> None:
        """Replace each parameter's local gradient by the exchanged average (every rank, once per
        update); under local SGD, only note that an update is under way."""
        self._update_pending = True
        if isinstance(self.exchange, LocalSGD):
            return
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for p, g in zip(self.params, self.exchange.reduce([p.grad for p in self.params])):
            p.grad.copy_(g)

    def skip_synchronize(self) -> contextlib.AbstractContextManager:
        """Like Horovod's: ``step()`` never communicates here, so nothing to skip."""
        return contextlib.nullcontext()

    def step(self, closure: Any = None) -> Any:
        """The wrapped optimizer's step on the exchanged gradients."""
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; under local SGD this ends the update and may average the replicas."""
        self.optimizer.zero_grad(set_to_none=set_to_none)
        if self._update_pending and isinstance(self.exchange, LocalSGD):
            self.exchange.after_update()
        self._update_pending = False

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer."""
        self.optimizer.load_state_dict(state_dict)

    # The adapter's compression-state hooks (see FrameworkAdapter.comm_state).
    def comm_state(self) -> dict[str, np.ndarray]:
        """This rank's exchange state for the checkpoint."""
        return self.exchange.state()

    def load_comm_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from what :meth:`comm_state` returned on this rank."""
        self.exchange.load_state(state, self.params[0].device if self.params else torch.device("cpu"))

    def reset_comm_state(self) -> None:
        """Start the exchange afresh (a new world size)."""
        self.exchange.reset()

    def sync_replicas(self) -> None:
        """Local SGD: average the replicas now (before an evaluation); otherwise nothing."""
        if isinstance(self.exchange, LocalSGD):
            self.exchange.average()


def exchange_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, config: Any) -> Any:
    """An :class:`ExchangeOptimizer` around ``optimizer`` when the config asks for PowerSGD, top-k
    or local SGD; None when Horovod's own ``DistributedOptimizer`` does the job."""
    from hvdtrain.core.compression import comm_plan

    plan = comm_plan(config)
    return None if plan is None else ExchangeOptimizer(optimizer, model, plan)
