"""Pipeline parallelism for PyTorch: :class:`TorchPipelineAdapter` (``parallel.pipeline_stages > 1``).

The recipe's ``TrainTask.pipeline_blocks()`` lists the model as ordered blocks; the blocks are cut
into S stages (:mod:`hvdtrain.core.pipeline`) and each rank keeps only its stage's parameters
(the other blocks are moved to torch's ``meta`` device, which frees their memory). One
``train_step`` runs the whole GPipe schedule: per tick every stage computes one micro-batch, then
the replica's ranks exchange activations (forward) or their gradients (backward) with one
``hvd.alltoall`` on the replica's process set. The receiving stage runs its blocks on the
received tensor with ``requires_grad`` and sends the tensor's gradient back in the backward ticks.
After the last micro-batch each stage averages its gradients over its replicas (one grouped
allreduce on the stage's process set), the global gradient norm is summed over the stages (one
allreduce on the replica's set, which also hands every stage the last stage's loss), and every
stage clips by that norm and steps.

Checkpoints keep the non-pipelined format: before a save every stage of replica 0 sends its
parameters, buffers and optimizer state to rank 0, which writes the whole model's ``state_dict``
and one optimizer ``state_dict`` indexed as the recipe's un-cut optimizer would be; a load on
rank 0 is split up again in :meth:`TorchPipelineAdapter.broadcast_state`.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch

from hvdtrain.core import pipeline
from hvdtrain.core.adapter import DistContext, NonFiniteGradientError
from hvdtrain.core.rules import fp16_allreduce
from hvdtrain.torch.adapter import MODEL_FILE, OPTIMIZER_FILE, TorchAdapter

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


def _slice(inputs: Any, start: int, stop: int) -> Any:
    if isinstance(inputs, dict):
        return {k: v[start:stop] for k, v in inputs.items()}
    return inputs[start:stop]


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


class TorchPipelineAdapter(TorchAdapter):
    """The model cut into stages across the ranks of each replica, replicas data-parallel."""

    def init(self, config: Any) -> DistContext:
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # process sets are added after hvd.init()
        super().init(config)
        self.layout = pipeline.Layout.for_world(hvd.size(), config.parallel.pipeline_stages)
        rank = hvd.rank()
        self.stage, self.replica = self.layout.stage_of(rank), self.layout.replica_of(rank)
        self.stage_set, self.replica_set = self.layout.open_process_sets(hvd, rank)  # None: a single replica
        self.ctx = DistContext(rank, hvd.size(), hvd.local_rank(), hvd.local_size(),
                               replica=self.replica, replicas=self.layout.replicas, mpi=hvd.mpi_enabled(),
                               gpu=self.device.type == "cuda")
        return self.ctx

    def context(self) -> DistContext:
        return self.ctx

    # -- preparing the stage ------------------------------------------------------------------

    def prepare(self, task: Any, config: Any) -> None:
        stages = self.layout.stages
        self.task, self.model = task, task.model
        blocks = pipeline.model_blocks(task, config)
        costs = [sum(p.numel() for p in b.parameters()) for b in blocks]
        self.bounds = pipeline.resolve_cut(config.parallel.cut, costs, stages)
        owner = pipeline.tensor_owners(self.bounds, blocks, stages,
                                       lambda block: block.state_dict(keep_vars=True).values())
        full_state = self.model.state_dict(keep_vars=True)
        param_names = {id(p): n for n, p in self.model.named_parameters()}
        missing = [n for n, p in self.model.named_parameters() if id(p) not in owner]
        if missing:
            raise ValueError(f"pipeline_blocks() does not cover the model's parameters {missing[:3]}")
        self.full_names = list(full_state)  # checkpoint order; buffers outside every block go to stage 0
        self.stage_of_name = {n: owner.get(id(t), 0) for n, t in full_state.items()}
        self.own_names = [n for n in self.full_names if self.stage_of_name[n] == self.stage]
        self.cost_per_stage = [sum(costs[b] for b in pipeline.stage_blocks(self.bounds, len(blocks), s))
                               for s in range(stages)]

        optimizer = task.optimizer
        self.full_optimizer_names = [[param_names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        for group in optimizer.param_groups:  # this stage's parameters only; empty groups keep the indices
            group["params"] = [p for p in group["params"] if owner[id(p)] == self.stage]
        self.own_optimizer_names = [[param_names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        self.optimizer = optimizer
        self.blocks = [blocks[b] for b in pipeline.stage_blocks(self.bounds, len(blocks), self.stage)]
        self.other_blocks = [block for b, block in enumerate(blocks)
                             if b not in pipeline.stage_blocks(self.bounds, len(blocks), self.stage)]
        for block in self.other_blocks:  # free the parameters other stages hold: only their shapes stay
            _to_meta(block)
        for block in self.blocks:
            block.to(self.device)
        self.own_tensors = {n: t for n, t in self.model.state_dict().items() if n in set(self.own_names)}

        self.micro_batches = config.parallel.micro_batches
        self.grad_clip_norm = config.optim.grad_clip_norm
        self.nonfinite = config.train.nonfinite
        self.compression = hvd.Compression.fp16 if fp16_allreduce(config) else hvd.Compression.none
        self.autocast_dtype = {"bf16": torch.bfloat16}.get(config.train.mixed_precision)
        self.scaler = None
        self.accumulation = 1
        self.adasum = self.overlap = False
        self.first, self.last = self.stage == 0, self.stage == stages - 1
        self._pending: dict[str, Any] | None = None
        self._gathered: list[dict[str, Any]] | None = None
        self._metric_keys: list[str] | None = None
        self._final_model: dict[str, torch.Tensor] | None = None
        if task.export is not None:  # rank 0 exports the whole model: from the last checkpoint's gathered state
            task.export = self._with_whole_model(task.export)

    def _with_whole_model(self, export: Any) -> Any:
        def run(output: Any) -> None:
            if self._final_model is None:
                raise RuntimeError("exporting a pipelined model needs the whole model on rank 0, which the "
                                   "end-of-epoch checkpoint gathers; run with checkpoint.enabled=true")
            for block in self.other_blocks:
                _materialize(block, self.device)
            self.model.load_state_dict(self._final_model)
            export(output)
        return run

    # -- the schedule -------------------------------------------------------------------------

    def _run_blocks(self, x: Any, inputs: Any) -> Any:
        for block in self.blocks:
            x = block(x, inputs) if getattr(block, "needs_inputs", False) else block(x)
        return x

    def _exchange(self, payload: torch.Tensor | None, to_stage: int | None, name: str) -> torch.Tensor | None:
        """One tick's transfer inside the replica: send ``payload`` to ``to_stage`` (or nothing) and
        return what this rank received (None: nothing)."""
        send = payload if payload is not None else torch.empty(0, dtype=TRANSFER_DTYPE, device=self.device)
        splits = torch.zeros(self.layout.stages, dtype=torch.int32)
        if to_stage is not None:
            splits[to_stage] = send.numel()
        received, _ = hvd.alltoall(send, splits=splits, name=name, process_set=self.replica_set)  # distributed
        return received if received.numel() else None

    def _forward_ticks(self, inputs: Any, targets: Any, sizes: list[int], train: bool) -> dict[int, Any]:
        """GPipe fill over micro-batches of ``sizes``: returns, per micro-batch this stage ran, its
        received input and output (the last stage: the outputs themselves)."""
        s, stages = self.stage, self.layout.stages
        offsets = [sum(sizes[:m]) for m in range(len(sizes))]
        received: dict[int, torch.Tensor] = {}
        results: dict[int, Any] = {}
        for t, row in enumerate(pipeline.forward_ticks(stages, len(sizes))):
            m, payload = row[s], None
            if m is not None:
                mb_inputs = _slice(inputs, offsets[m], offsets[m] + sizes[m])
                x = mb_inputs if self.first else received[m]
                with self._autocast():
                    y = self._run_blocks(x, mb_inputs)
                results[m] = (x, y)
                if not self.last:
                    payload = pack(y)
            if any(row[k] is not None for k in range(stages - 1)):
                got = self._exchange(payload, s + 1 if payload is not None else None, f"hvdtrain.pipe.fwd.{t}")
                if not self.first and row[s - 1] is not None:
                    received[row[s - 1]] = unpack(got).requires_grad_(train)
        return results

    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True,
                   weight: float | None = None) -> float:  # weight: always the whole batch (no accumulation)
        for block in self.blocks:
            block.train()
        inputs, targets = self._move(inputs), self._to_device(targets)
        n, s, stages = len(targets), self.stage, self.layout.stages
        sizes = pipeline.split_sizes(n, self.micro_batches)
        offsets = [sum(sizes[:m]) for m in range(len(sizes))]
        results = self._forward_ticks(inputs, targets, sizes, train=True)
        loss_sum = 0.0
        grads_in: dict[int, torch.Tensor] = {}
        for t, row in enumerate(pipeline.backward_ticks(stages, len(sizes))):
            m, payload = row[s], None
            if m is not None:
                x, y = results.pop(m)
                if self.last:
                    with self._autocast():
                        loss = self.task.loss_fn(y, targets[offsets[m]:offsets[m] + sizes[m]])
                    loss_sum += float(loss.detach()) * sizes[m]
                    (loss * (sizes[m] / n)).backward()  # the whole batch's mean loss, one micro-batch at a time
                else:
                    y.backward(grads_in.pop(m).to(y.dtype))
                if not self.first:
                    payload = pack(x.grad)
            if any(row[k] is not None for k in range(1, stages)):
                got = self._exchange(payload, s - 1 if payload is not None else None, f"hvdtrain.pipe.bwd.{t}")
                if not self.last and row[s + 1] is not None:
                    grads_in[row[s + 1]] = unpack(got)
        return self._apply_update(loss_sum / n)

    def _apply_update(self, loss: float) -> float:  # type: ignore[override]
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.stage_set is not None and params:  # average this stage over its replicas
            reduced = hvd.grouped_allreduce([p.grad for p in params], op=hvd.Average, name="hvdtrain.pipe.grads",
                                            compression=self.compression, process_set=self.stage_set)  # distributed
            for p, g in zip(params, reduced):
                p.grad.copy_(g)
        local = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.tensor(0.0)
        totals = hvd.allreduce(torch.tensor([float(local) ** 2, loss if self.last else 0.0], dtype=torch.float64),
                               op=hvd.Sum, name="hvdtrain.pipe.norm", process_set=self.replica_set)  # distributed
        norm, loss = float(totals[0]) ** 0.5, float(totals[1])
        if not torch.isfinite(torch.tensor(norm)):
            self.optimizer.zero_grad()
            if self.nonfinite == "error":
                raise NonFiniteGradientError(f"the allreduced gradient is not finite (norm {norm})")
            self.skipped_updates += 1
            return loss
        if self.grad_clip_norm is not None and params:
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip_norm, torch.tensor(norm))
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss

    @torch.no_grad()
    def eval_step(self, inputs: Any, targets: Any) -> dict[str, float]:
        for block in self.blocks:
            block.eval()
        inputs, targets = self._move(inputs), self._to_device(targets)
        results = self._forward_ticks(inputs, targets, [len(targets)], train=False)
        sums: dict[str, float] = {}
        if self.last:
            with self._autocast():
                outputs = results[0][1]
                loss = self.task.loss_fn(outputs, targets)
            count = len(targets)
            sums = {"loss_sum": float(loss) * count, "count": float(count)}
            sums.update({k: float(v) for k, v in self.task.metric_sums(outputs, targets).items()})
        if self._metric_keys is None:  # the other stages learn the keys once and report zeros
            root = self.layout.rank_of(self.layout.stages - 1, self.replica)
            self._metric_keys = hvd.broadcast_object(sorted(sums), root_rank=root, name="hvdtrain.pipe.keys",
                                                     process_set=self.replica_set)  # distributed
        return {k: sums[k] for k in self._metric_keys} if self.last else {k: 0.0 for k in self._metric_keys}

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # -- state: broadcast, checkpoints --------------------------------------------------------

    def _own_optimizer_state(self) -> dict[str, Any]:
        """This stage's optimizer state keyed by parameter name, and the groups' settings."""
        sd = self.optimizer.state_dict()
        flat = [n for names in self.own_optimizer_names for n in names]
        return {"state": {flat[i]: st for i, st in sd["state"].items()},
                "groups": [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]}

    def _load_own_optimizer_state(self, by_name: dict[str, Any]) -> None:
        index, groups, j = {}, [], 0
        for g, names in enumerate(self.own_optimizer_names):
            groups.append({**by_name["groups"][g], "params": list(range(j, j + len(names)))})
            index.update({n: j + i for i, n in enumerate(names)})
            j += len(names)
        state = {index[n]: st for n, st in by_name["state"].items() if n in index}
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})

    def broadcast_state(self, root_rank: int = 0) -> None:
        pending = hvd.broadcast_object(self._pending, root_rank=root_rank, name="hvdtrain.pipe.restore")  # distributed
        self._pending = None
        if pending is not None:  # rank 0 loaded a checkpoint: every stage takes its part
            with torch.no_grad():
                for n in self.own_names:
                    self.own_tensors[n].copy_(pending["model"][n])
            self._load_own_optimizer_state(pending["optimizer"])
        if self.stage_set is None:
            return
        root = self.layout.rank_of(self.stage, 0)
        handles = [hvd.broadcast_async_(t, root, name=f"hvdtrain.pipe.bcast.{n}", process_set=self.stage_set)
                   for n, t in self.own_tensors.items()]  # distributed: the stage's replicas start equal
        for h in handles:
            hvd.synchronize(h)
        optim = hvd.broadcast_object(self._own_optimizer_state(), root_rank=root, name="hvdtrain.pipe.optim",
                                     process_set=self.stage_set)  # distributed
        if hvd.rank() != root:
            self._load_own_optimizer_state(optim)

    def sync_model_buffers(self) -> None:
        """BatchNorm statistics of this stage's own blocks, averaged over the stage's replicas only."""
        own = set(self.own_names)
        buffers = [b for n, b in self.model.named_buffers() if n in own and b.is_floating_point()]
        if not buffers or self.stage_set is None:
            return
        averaged = hvd.grouped_allreduce(buffers, op=hvd.Average, name=f"hvdtrain.pipe.buffers.{self.stage}",
                                         process_set=self.stage_set)  # distributed: this stage's replicas
        with torch.no_grad():
            for buffer, value in zip(buffers, averaged):
                buffer.copy_(value)

    def gather_state(self) -> None:
        if self.replica == 0:
            self._gather_replica_zero()
        # distributed: nobody leaves (a rank that exits shuts Horovod down) before rank 0 holds everything
        hvd.allreduce(torch.zeros(1), name="hvdtrain.pipe.gathered")

    def _gather_replica_zero(self) -> None:
        mine = {"model": {n: t.detach().cpu().clone() for n, t in self.own_tensors.items()},
                "optimizer": self._own_optimizer_state()}
        gathered = [mine]
        for s in range(1, self.layout.stages):  # distributed: stage s of replica 0 -> rank 0 (and its neighbours)
            got = hvd.broadcast_object(mine if s == self.stage else None, root_rank=self.layout.rank_of(s, 0),
                                       name=f"hvdtrain.pipe.gather.{s}", process_set=self.replica_set)
            if self.ctx.is_main:
                gathered.append(got)
        self._gathered = gathered if self.ctx.is_main else None

    def state_is_finite(self) -> bool:
        parts = self._gathered or [{"model": self.own_tensors}]
        return all(bool(torch.isfinite(t).all()) for part in parts for t in part["model"].values()
                   if t.is_floating_point())

    def save_state(self, directory: Path) -> None:
        if self._gathered is None:
            raise RuntimeError("save_state on a pipeline stage without gather_state() first")
        model: dict[str, torch.Tensor] = {}
        state_by_name: dict[str, Any] = {}
        for part in self._gathered:
            model.update(part["model"])
            state_by_name.update(part["optimizer"]["state"])
        groups = self._gathered[0]["optimizer"]["groups"]
        flat = [n for names in self.full_optimizer_names for n in names]
        param_groups, j = [], 0
        for g, names in enumerate(self.full_optimizer_names):
            param_groups.append({**groups[g], "params": list(range(j, j + len(names)))})
            j += len(names)
        optimizer = {"state": {i: state_by_name[n] for i, n in enumerate(flat) if n in state_by_name},
                     "param_groups": param_groups}
        torch.save(OrderedDict((n, model[n]) for n in self.full_names), Path(directory) / MODEL_FILE)
        torch.save(optimizer, Path(directory) / OPTIMIZER_FILE)
        self._gathered = None
        if self.task.export is not None:
            self._final_model = model

    def load_state(self, directory: Path) -> None:
        model = torch.load(Path(directory) / MODEL_FILE, map_location="cpu", weights_only=True)
        missing = sorted(set(self.full_names) - set(model))
        if missing:
            raise ValueError(f"checkpoint {directory} does not hold this model: missing {missing[:3]}")
        optimizer = torch.load(Path(directory) / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
        flat = [n for names in self.full_optimizer_names for n in names]
        if len(optimizer["param_groups"]) != len(self.full_optimizer_names):
            raise ValueError(f"checkpoint {directory}: the optimizer has {len(optimizer['param_groups'])} parameter "
                             f"groups, this run {len(self.full_optimizer_names)}")
        self._pending = {"model": model, "optimizer": {
            "state": {flat[i]: st for i, st in optimizer["state"].items()},
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer["param_groups"]]}}

    # -- elastic mode is refused before this adapter is used ------------------------------------

    def snapshot(self) -> Any:
        raise NotImplementedError("pipeline stages do not support elastic mode")

    def restore_snapshot(self, snapshot: Any) -> None:
        raise NotImplementedError("pipeline stages do not support elastic mode")

    def elastic_reset(self) -> None:
        raise NotImplementedError("pipeline stages do not support elastic mode")
