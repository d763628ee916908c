"""One pipeline stage in PyTorch: the primitives :class:`hvdtrain.core.gpipe.GPipe` drives.

The schedule, the update's reductions and the movement of state are in :mod:`hvdtrain.core.gpipe`;
here are only what needs torch or ``horovod.torch``: running this stage's blocks, backward of one
micro-batch, packing a tensor for transfer, the collectives on the stage's and the replica's
process sets, and this stage's state. Each rank keeps only its stage's parameters (the other
blocks' parameters move to torch's ``meta`` device, which frees their memory) and an optimizer
over them; checkpoints keep the un-cut format (the model's ``state_dict`` and one optimizer
``state_dict`` indexed as the recipe's un-cut optimizer would be).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import horovod.torch as hvd
import torch

from hvdtrain.core.collectives import broadcast_pickled
from hvdtrain.core.gpipe import Cut, Placement
from hvdtrain.core.exchange_plan import Workers, plan_exchange
from hvdtrain.torch.adapter import MODEL_FILE, OPTIMIZER_FILE, group_settings
from hvdtrain.torch.weights import load_weights_only

TRANSFER_DTYPE = torch.float32


def pack(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor as one flat float32 vector: ``[ndim, *shape, *values]`` (the receiver learns the shape
    from the payload, so no separate size exchange is needed)."""
    if any(d >= 2 ** 24 for d in tensor.shape):
        raise ValueError(f"pipeline transfer: dimension of {tuple(tensor.shape)} too large to encode")
    header = torch.tensor([tensor.dim(), *tensor.shape], dtype=TRANSFER_DTYPE, device=tensor.device)
    return torch.cat([header, tensor.detach().to(TRANSFER_DTYPE).reshape(-1)])


def unpack(payload: torch.Tensor) -> torch.Tensor:
    """The tensor :func:`pack` encoded."""
    ndim = int(payload[0])
    shape = [int(d) for d in payload[1:1 + ndim].tolist()]
    return payload[1 + ndim:].reshape(shape)


def _to_meta(module: torch.nn.Module) -> None:
    """Replace ``module``'s parameters by storage-free ``meta`` ones of the same shape (buffers,
    small and sometimes not in the state dict, stay)."""
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None and param.device.type != "meta":
                sub._parameters[name] = torch.nn.Parameter(param.detach().to("meta"), param.requires_grad)


def _materialize(module: torch.nn.Module, device: torch.device) -> None:
    """Give :func:`_to_meta`'s parameters real (uninitialised) storage again."""
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None and param.device.type == "meta":
                sub._parameters[name] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype,
                                                                       device=device), param.requires_grad)


def _indexed(names: list[list[str]], settings: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Optimizer ``param_groups`` for groups holding the parameters ``names`` (indices counted across
    the groups, as ``Optimizer.state_dict`` does), and each name's index."""
    groups, index, j = [], {}, 0
    for g, group_names in enumerate(names):
        groups.append({**settings[g], "params": list(range(j, j + len(group_names)))})
        index.update({n: j + i for i, n in enumerate(group_names)})
        j += len(group_names)
    return groups, index


class TorchStage:
    """This rank's stage of the recipe's model (see :class:`hvdtrain.core.gpipe.Stage` for the
    primitives). ``host``: the torch adapter, whose device, batch transfer and skip counter it uses."""

    def __init__(self, host: Any, task: Any, config: Any, placement: Placement):
        self.host, self.task, self.placement = host, task, placement
        self.device = host.device
        self.model = model = task.model
        stage = placement.stage
        self.cut = cut = Cut.of(task, config, stage, lambda block: sum(p.numel() for p in block.parameters()),
                                lambda block: block.state_dict(keep_vars=True).values())
        self.bounds = cut.bounds
        full_state = model.state_dict(keep_vars=True)
        param_names = {id(p): n for n, p in model.named_parameters()}
        missing = [n for n, p in model.named_parameters() if id(p) not in cut.owner]
        if missing:
            raise ValueError(f"pipeline_blocks() does not cover the model's parameters {missing[:3]}")
        self.full_names = list(full_state)  # checkpoint order; buffers outside every block go to stage 0
        self.stage_of_name = {n: cut.stage_of(t) for n, t in full_state.items()}
        self.own_names = [n for n in self.full_names if self.stage_of_name[n] == stage]

        optimizer = task.optimizer
        self.full_optimizer_names = [[param_names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        for group in optimizer.param_groups:  # this stage's parameters only; empty groups keep the indices
            group["params"] = [p for p in group["params"] if cut.stage_of(p) == stage]
        self.own_optimizer_names = [[param_names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        self.optimizer = optimizer
        self.blocks, self.other_blocks = cut.own, cut.others
        for block in self.other_blocks:  # free the parameters other stages hold: only their shapes stay
            _to_meta(block)
        for block in self.blocks:
            block.to(self.device)
        own = set(self.own_names)
        self.own_tensors = {n: t for n, t in model.state_dict().items() if n in own}
        self.compression = hvd.Compression.fp16 if plan_exchange(config, Workers()).fp16_wire else hvd.Compression.none
        self.autocast_dtype = {"bf16": torch.bfloat16}.get(config.train.mixed_precision)  # fp16: refused
        self.final_model: dict[str, torch.Tensor] | None = None
        if task.export is not None:  # rank 0 exports the whole model: from the last checkpoint's gathered state
            task.export = self._with_whole_model(task.export)

    def _with_whole_model(self, export: Any) -> Any:
        def run(output: Any) -> None:
            if self.final_model is None:
                raise RuntimeError("exporting a pipelined model needs the whole model on rank 0, which the "
                                   "end-of-epoch checkpoint gathers; run with checkpoint.enabled=true")
            for block in self.other_blocks:
                _materialize(block, self.device)
            self.model.load_state_dict(self.final_model)
            export(output)
        return run

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    # -- compute ----------------------------------------------------------------------------------

    def run_blocks(self, x: Any, inputs: Any) -> Any:
        """This stage's blocks on ``x`` (``inputs``: the micro-batch's inputs, for blocks with
        ``needs_inputs``)."""
        for block in self.blocks:
            x = block(x, inputs) if getattr(block, "needs_inputs", False) else block(x)
        return x

    def begin(self, inputs: Any, targets: Any, training: bool) -> tuple[Any, torch.Tensor, int]:
        """Training or evaluation mode for this stage's blocks; the batch on the device."""
        for block in self.blocks:
            block.train(training)
        inputs, targets = self.host._move(inputs), self.host._to_device(targets)
        return inputs, targets, len(targets)

    def forward(self, x: Any, inputs: Any, targets: Any, weight: float, training: bool) -> tuple[Any, Any]:
        """The blocks on ``x`` (autograd records them in training); the loss waits for :meth:`backward`."""
        with torch.set_grad_enabled(training), self._autocast():
            y = self.run_blocks(x, inputs)
        return (x, targets, weight), y

    def backward(self, saved: Any, y: Any, grad: torch.Tensor | None) -> tuple[float | None, Any]:
        """Gradients of one micro-batch into the parameters' ``.grad``; the input's gradient."""
        x, targets, weight = saved
        loss = None
        if grad is None:  # the last stage: the whole batch's mean loss, one micro-batch at a time
            with self._autocast():
                mb_loss = self.task.loss_fn(y, targets)
            loss = float(mb_loss.detach())
            (mb_loss * weight).backward()
        else:
            y.backward(grad.to(y.dtype))
        return loss, None if self.placement.first else x.grad

    @torch.no_grad()
    def eval_sums(self, outputs: Any, targets: torch.Tensor) -> tuple[float, dict[str, float]]:
        """The mean loss and the task's metric sums on the model's ``outputs``."""
        with self._autocast():
            loss = self.task.loss_fn(outputs, targets)
        return float(loss), {k: float(v) for k, v in self.task.metric_sums(outputs, targets).items()}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """See :func:`pack`."""
        return pack(tensor)

    def unpack(self, payload: torch.Tensor, requires_grad: bool) -> torch.Tensor:
        """See :func:`unpack`; a received activation records its gradient in training."""
        tensor = unpack(payload)
        return tensor.requires_grad_(True) if requires_grad else tensor

    # -- the update -------------------------------------------------------------------------------

    def gradients(self) -> list[torch.Tensor]:
        """The own parameters' ``.grad`` (zeros for a parameter no gradient reached)."""
        params = self._params()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in params]

    def norm(self, tensors: list[torch.Tensor]) -> float:
        """The L2 norm of all ``tensors`` together."""
        return float(torch.nn.utils.get_total_norm(tensors))

    def apply(self, grads: list[torch.Tensor], clip_norm: float | None, norm: float) -> None:
        """``grads`` (averaged copies) into ``.grad``, clipped by the global norm; step; clear."""
        params = self._params()
        for p, g in zip(params, grads):
            if g is not p.grad:
                p.grad.copy_(g)
        if clip_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, clip_norm, torch.tensor(norm))
        self.optimizer.step()
        self.optimizer.zero_grad()

    def discard_gradients(self) -> None:
        """Clear ``.grad`` without a step."""
        self.optimizer.zero_grad()

    def count_skipped_update(self) -> None:
        """One more skipped update on the adapter."""
        self.host.skipped_updates += 1

    # -- collectives ------------------------------------------------------------------------------

    def alltoall(self, payload: torch.Tensor | None, to_stage: int | None, name: str) -> torch.Tensor | None:
        """One tick's transfer inside the replica (``hvd.alltoall`` on its set)."""
        send = payload if payload is not None else torch.empty(0, dtype=TRANSFER_DTYPE, device=self.device)
        splits = torch.zeros(self.placement.layout.stages, dtype=torch.int32)
        if to_stage is not None:
            splits[to_stage] = send.numel()
        received, _ = hvd.alltoall(send, splits=splits, name=name,
                                   process_set=self.placement.replica_set)  # distributed
        return received if received.numel() else None

    def stage_average(self, tensors: list[torch.Tensor], name: str, compress: bool) -> list[torch.Tensor]:
        """``tensors`` averaged over the stage's replicas (one grouped allreduce)."""
        return hvd.grouped_allreduce(tensors, op=hvd.Average, name=name,  # distributed: the stage's set
                                     compression=self.compression if compress else hvd.Compression.none,
                                     process_set=self.placement.stage_set)

    def allreduce_sum(self, values: list[float], name: str, process_set: Any) -> list[float]:
        """``values`` summed over ``process_set`` in float64."""
        summed = hvd.allreduce(torch.tensor(values, dtype=torch.float64), op=hvd.Sum, name=name,
                               process_set=process_set)  # distributed
        return [float(v) for v in summed]

    def broadcast_object(self, obj: Any, root_rank: int, name: str, process_set: Any) -> Any:
        """``obj`` from ``root_rank`` over ``process_set``."""
        return broadcast_pickled(hvd, torch.from_numpy, obj, root_rank, name, process_set)  # distributed

    # -- state of the own blocks ------------------------------------------------------------------

    def _own_optimizer_state(self) -> dict[str, Any]:
        """This stage's optimizer state keyed by parameter name, and the groups' settings."""
        sd = self.optimizer.state_dict()
        flat = [n for names in self.own_optimizer_names for n in names]
        return {"optimizer": {flat[i]: st for i, st in sd["state"].items()}, "groups": group_settings(sd["param_groups"])}

    def _load_own_optimizer_state(self, state: dict[str, Any]) -> None:
        groups, index = _indexed(self.own_optimizer_names, state["groups"])
        self.optimizer.load_state_dict({"state": {index[n]: st for n, st in state["optimizer"].items() if n in index},
                                        "param_groups": groups})

    def own_state(self) -> dict[str, Any]:
        """This stage's parameters and buffers (CPU copies) and optimizer state, by name."""
        return {"model": {n: t.detach().cpu().clone() for n, t in self.own_tensors.items()},
                **self._own_optimizer_state()}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """This stage's tensors and optimizer state out of a whole-model state."""
        with torch.no_grad():
            for n in self.own_names:
                self.own_tensors[n].copy_(state["model"][n])
        self._load_own_optimizer_state(state)

    def broadcast_own_state(self, root_rank: int) -> None:
        """Parameters, buffers and optimizer state from ``root_rank`` to the stage's other replicas."""
        stage_set = self.placement.stage_set
        handles = [hvd.broadcast_async_(t, root_rank, name=f"hvdtrain.pipe.bcast.{n}", process_set=stage_set)
                   for n, t in self.own_tensors.items()]  # distributed: the stage's replicas start equal
        for h in handles:
            hvd.synchronize(h)
        optim = self.broadcast_object(self._own_optimizer_state(), root_rank, "hvdtrain.pipe.optim", stage_set)
        if self.placement.rank != root_rank:
            self._load_own_optimizer_state(optim)

    def statistics(self) -> list[torch.Tensor]:
        """The floating-point buffers (BatchNorm statistics) of this stage's own blocks."""
        own = set(self.own_names)
        return [b for n, b in self.model.named_buffers() if n in own and b.is_floating_point()]

    def assign(self, tensors: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """``values`` copied into ``tensors``."""
        with torch.no_grad():
            for tensor, value in zip(tensors, values):
                tensor.copy_(value)

    def all_finite(self, values: Sequence[torch.Tensor]) -> bool:
        """True if every floating-point tensor in ``values`` is finite."""
        return all(bool(torch.isfinite(t).all()) for t in values if t.is_floating_point())

    def read_checkpoint(self, directory: Path) -> dict[str, Any]:
        """``model.pt`` and ``optimizer.pt`` as a whole-model state keyed by parameter name."""
        model = load_weights_only(directory / MODEL_FILE, map_location="cpu")
        missing = sorted(set(self.full_names) - set(model))
        if missing:
            raise ValueError(f"checkpoint {directory} does not hold this model: missing {missing[:3]}")
        optimizer = load_weights_only(directory / OPTIMIZER_FILE, map_location="cpu")
        flat = [n for names in self.full_optimizer_names for n in names]
        if len(optimizer["param_groups"]) != len(self.full_optimizer_names):
            raise ValueError(f"checkpoint {directory}: the optimizer has {len(optimizer['param_groups'])} parameter "
                             f"groups, this run {len(self.full_optimizer_names)}")
        return {"model": model, "optimizer": {flat[i]: st for i, st in optimizer["state"].items()},
                "groups": group_settings(optimizer["param_groups"])}

    def write_checkpoint(self, directory: Path, state: dict[str, Any]) -> None:
        """The whole model's ``state_dict`` and the un-cut optimizer's ``state_dict``."""
        model, by_name = state["model"], state["optimizer"]
        groups, index = _indexed(self.full_optimizer_names, state["groups"])
        optimizer = {"state": {i: by_name[n] for n, i in index.items() if n in by_name}, "param_groups": groups}
        torch.save(OrderedDict((n, model[n]) for n in self.full_names), directory / MODEL_FILE)
        torch.save(optimizer, directory / OPTIMIZER_FILE)
        if self.task.export is not None:
            self.final_model = model
