"""The :class:`~hvdtrain.core.adapter.FrameworkAdapter` for PyTorch and ``horovod.torch``."""

from __future__ import annotations

import contextlib
import copy
import os
import random
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from hvdtrain.core.adapter import DistContext, FrameworkAdapter, NonFiniteGradientError
from hvdtrain.core.comm import overlap_gradients, reduction_problem
from hvdtrain.core.compression import uses_fp16_allreduce
from hvdtrain.core.config import ConfigError
from hvdtrain.core.launch import prepare_horovod_environment
from hvdtrain.torch.compression import ExchangeOptimizer, exchange_optimizer

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
SCALER_FILE = "grad_scaler.pt"


def default_threads(local_size: int) -> int:
    """Cores shared evenly among the workers on this host."""
    return max(1, (os.cpu_count() or 1) // max(1, local_size))


class TorchAdapter(FrameworkAdapter):
    """Gradients allreduced by ``hvd.DistributedOptimizer`` (named parameters, optional fp16
    compression, ``backward_passes_per_step`` accumulation, average or Adasum); state broadcast
    from rank 0."""

    name = "torch"

    def init(self, config: Any) -> DistContext:
        train_config = config.train
        prepare_horovod_environment(config)  # comm options become HOROVOD_* variables before init
        hvd.init()
        torch.set_num_threads(train_config.threads or default_threads(hvd.local_size()))
        random.seed(train_config.seed)
        np.random.seed(train_config.seed)
        torch.manual_seed(train_config.seed)
        if train_config.deterministic:
            torch.use_deterministic_algorithms(True)
        self.device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if train_config.mixed_precision == "fp16" and self.device.type != "cuda":
            raise ConfigError("train.mixed_precision: 'fp16' needs a GPU; use 'bf16' on CPU")
        self.ctx = DistContext(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
        return self.ctx

    def prepare(self, task: Any, config: Any) -> None:
        train_config, optim_config = config.train, config.optim
        self.task = task
        self.model = task.model.to(self.device)
        self.accumulation = train_config.grad_accumulation
        self.grad_clip_norm = optim_config.grad_clip_norm
        self.nonfinite = train_config.nonfinite
        compression = hvd.Compression.fp16 if uses_fp16_allreduce(config) else hvd.Compression.none
        self.adasum = config.comm.reduction == "adasum" and hvd.size() > 1
        if self.adasum:
            problem = reduction_problem(config.comm, hvd.size(), hvd.mpi_enabled())
            if problem is None and (optim_config.grad_clip_norm is not None or train_config.mixed_precision == "fp16"):
                problem = ("comm.reduction: 'adasum' combines each worker's optimizer update, so torch cannot also "
                           "use optim.grad_clip_norm or train.mixed_precision=fp16 (gradient scaling); unset those "
                           "or use comm.reduction=average")
            if problem:
                raise ConfigError(problem)
        self.overlap = overlap_gradients(config.comm, self.device.type == "cuda", hvd.local_size(),
                                         torch.get_num_threads(), os.cpu_count() or 1)
        # PowerSGD, top-k or local SGD: hvdtrain's own exchange (hvdtrain.torch.compression); else Horovod's
        self.optimizer = exchange_optimizer(task.optimizer, self.model, config) or hvd.DistributedOptimizer(
            task.optimizer, named_parameters=self.model.named_parameters(),
            compression=compression, backward_passes_per_step=self.accumulation,
            op=hvd.Adasum if self.adasum else hvd.Average,
            # groups=1 makes this constructor a collective (it broadcasts the parameter order): a worker
            # joining an elastic job builds its optimizer alone, so elastic runs keep per-tensor groups.
            groups=None if self.overlap or train_config.elastic else 1)
        self.comm_exchange = self.optimizer if isinstance(self.optimizer, ExchangeOptimizer) else None
        self.overlap = self.overlap and self.comm_exchange is None
        precision = train_config.mixed_precision
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def broadcast_state(self, root_rank: int = 0) -> None:
        # Horovod creates missing optimizer state with one zero-gradient step; LR 0 makes that step
        # a no-op for every optimizer (weight decay included). The schedule sets the real LR.
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=root_rank)  # distributed
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=root_rank)  # distributed
        if self.scaler is not None:
            self.scaler.load_state_dict(self.broadcast_object(self.scaler.state_dict(), root_rank))

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _to_device(self, array: Any) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else array
        return tensor.to(self.device, non_blocking=True)

    def _move(self, inputs: Any) -> Any:
        if isinstance(inputs, dict):
            return {k: self._to_device(v) for k, v in inputs.items()}
        return self._to_device(inputs)

    def _forward(self, inputs: Any) -> Any:
        return self.model(**inputs) if isinstance(inputs, dict) else self.model(inputs)

    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True) -> float:
        self.model.train()
        inputs, targets = self._move(inputs), self._to_device(targets)
        with self._autocast():
            loss = self.task.loss_fn(self._forward(inputs), targets)
        scaled = loss / self.accumulation
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if apply_update:
            self._apply_update()
        return float(loss.detach())

    def _apply_update(self) -> None:
        if self.adasum:  # each parameter's local update was started in backward; combine and apply them
            self.optimizer.step()  # distributed: waits for the Adasum reduction of the updates
            self.optimizer.zero_grad()
            return
        self.optimizer.synchronize()  # distributed: finish the gradient allreduce before reading gradients
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if self.scaler is None and not torch.isfinite(norm):
            self.optimizer.zero_grad()
            if self.nonfinite == "error":
                raise NonFiniteGradientError(f"the allreduced gradient is not finite (norm {float(norm)})")
            self.skipped_updates += 1
            return
        if self.grad_clip_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), self.grad_clip_norm, norm)
        with self.optimizer.skip_synchronize():
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # skips the update itself when fp16 gradients overflowed
                self.scaler.update()
            else:
                self.optimizer.step()
        self.optimizer.zero_grad()

    @torch.no_grad()
    def eval_step(self, inputs: Any, targets: Any) -> dict[str, float]:
        self.model.eval()
        inputs, targets = self._move(inputs), self._to_device(targets)
        with self._autocast():
            outputs = self._forward(inputs)
            loss = self.task.loss_fn(outputs, targets)
        count = len(targets)
        sums = {"loss_sum": float(loss) * count, "count": float(count)}
        sums.update({k: float(v) for k, v in self.task.metric_sums(outputs, targets).items()})
        return sums

    def allreduce_sums(self, values: dict[str, float]) -> dict[str, float]:
        keys = list(values)
        tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        reduced = hvd.allreduce(tensor, op=hvd.Sum, name="hvdtrain.allreduce_sums")  # distributed
        return dict(zip(keys, reduced.tolist()))

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        return hvd.broadcast_object(obj, root_rank=root_rank, name="hvdtrain.broadcast_object")  # distributed

    def allgather_object(self, obj: Any) -> list[Any]:
        return hvd.allgather_object(obj, name="hvdtrain.allgather_object")  # distributed

    def rng_state(self) -> dict[str, Any]:
        return {"torch_cpu": torch.get_rng_state().tolist(),
                "torch_cuda": torch.cuda.get_rng_state().tolist() if self.device.type == "cuda" else None}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(torch.tensor(state["torch_cpu"], dtype=torch.uint8))
        if state.get("torch_cuda") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(torch.tensor(state["torch_cuda"], dtype=torch.uint8))

    def context(self) -> DistContext:
        self.ctx = DistContext(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
        return self.ctx

    def snapshot(self) -> Any:
        return copy.deepcopy((self.model.state_dict(), self.optimizer.state_dict()))

    def restore_snapshot(self, snapshot: Any) -> None:
        model_state, optimizer_state = snapshot
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(optimizer_state)

    def elastic_reset(self) -> None:
        hvd.shutdown()
        hvd.init()
        self.reset_comm_state("elastic: the job re-formed")

    def state_is_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.model.parameters())

    def save_state(self, directory: Path) -> None:
        torch.save(self.model.state_dict(), Path(directory) / MODEL_FILE)
        torch.save(self.optimizer.state_dict(), Path(directory) / OPTIMIZER_FILE)
        if self.scaler is not None:
            torch.save(self.scaler.state_dict(), Path(directory) / SCALER_FILE)

    def load_state(self, directory: Path) -> None:
        # weights_only: tensors and plain containers only, never arbitrary pickled objects.
        model_state = torch.load(Path(directory) / MODEL_FILE, map_location=self.device, weights_only=True)
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(
            torch.load(Path(directory) / OPTIMIZER_FILE, map_location=self.device, weights_only=True))
        if self.scaler is not None and (Path(directory) / SCALER_FILE).is_file():
            self.scaler.load_state_dict(torch.load(Path(directory) / SCALER_FILE, weights_only=True))


def build_optimizer(params: Any, optim_config: Any) -> torch.optim.Optimizer:
    """The torch optimizer an :class:`~hvdtrain.core.config.OptimConfig` names (LR is set per step
    by the schedule). ``params`` may be parameters or parameter groups."""
    name, lr, wd = optim_config.name, optim_config.lr, optim_config.weight_decay
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=optim_config.momentum, weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    raise ConfigError(f"optim.name: {name!r} is not allowed; choose one of: sgd, adam, adamw")
