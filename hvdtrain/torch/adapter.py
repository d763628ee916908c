"""The :class:`~hvdtrain.core.adapter.FrameworkAdapter` for PyTorch and ``horovod.torch``.

On a GPU (following PyTorch's CUDA notes and performance-tuning guide): each process uses
``cuda:local_rank`` when it sees at least ``local_size`` GPUs and otherwise the one it sees (SLURM
``--gpus-per-task=1``, ``CUDA_VISIBLE_DEVICES`` set per process); TF32 matrix multiplies and
``cudnn.benchmark`` are on unless ``train.deterministic`` (which sets
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` as cuBLAS requires); batches are copied from pinned memory
without blocking; 4-D image batches and models with convolutions use the channels-last layout.
The loss and evaluation sums stay on the device until the loop reads them; under
``train.nonfinite=error`` the finite check is read once per log interval (:mod:`hvdtrain.torch.finite`),
so a bf16 or fp32 step needs no host synchronisation (``train.nonfinite=skip`` decides per update, and
fp16's ``GradScaler.step`` reads its overflow flag per update).
"""

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

from hvdtrain.core import finetune
from hvdtrain.core.optimizer_policy import FROM_CONFIG, OptimizerFacts, mark_from_config
from hvdtrain.core.adapter import DistContext, FrameworkAdapter, NonFiniteGradientError, NonFiniteStateError
from hvdtrain.core.collectives import Collectives
from hvdtrain.core.compiled import FirstStepClock
from hvdtrain.core.config import ConfigError
from hvdtrain.core.errors import TrainingError, type_name
from hvdtrain.core.exchange_plan import ExchangePlan, Workers, plan_exchange
from hvdtrain.core.gpipe import GPipe, pipelined
from hvdtrain import launch
from hvdtrain.torch import compiled, exchanges
from hvdtrain.torch.exchanges import WholeState, _hooks_off, group_settings  # noqa: F401 (their old home)
from hvdtrain.torch.finite import DeferredFiniteCheck
from hvdtrain.torch.finetune import LR_FACTOR, BackboneControl, head_parameters
from hvdtrain.torch.weights import load_weights_only

MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
SCALER_FILE = "grad_scaler.pt"
SCHEDULER_FILE = "lr_scheduler.pt"  # the task's own LR scheduler (TrainTask.scheduler), when it has one


def default_threads(local_size: int) -> int:
    """Cores shared evenly among the workers on this host."""
    return max(1, (os.cpu_count() or 1) // max(1, local_size))


@pipelined
class TorchAdapter(FrameworkAdapter):
    """Gradients exchanged by the run's :mod:`~hvdtrain.core.exchange` (by default
    ``hvd.DistributedOptimizer``: named parameters, optional fp16 compression,
    ``backward_passes_per_step`` accumulation, average or Adasum); state broadcast from rank 0.

    With ``parallel.pipeline_stages > 1`` the adapter holds this rank's stage of the cut model in
    ``pipeline`` (a :class:`~hvdtrain.core.gpipe.GPipe` over :class:`hvdtrain.torch.stage.TorchStage`)
    and hands it the steps and the model state; the rest (learning rate, RNG, objects, sums) stays."""

    name = "torch"
    checkpoint_files = (MODEL_FILE, OPTIMIZER_FILE)  # what load_state reads, pipeline stages too

    def init(self, config: Any) -> DistContext:
        train_config = config.train
        launch.start(hvd, config)  # the launcher's environment, HOROVOD_* from comm, hvd.init(), Slurm's world
        torch.set_num_threads(train_config.threads or default_threads(hvd.local_size()))
        random.seed(train_config.seed)
        np.random.seed(train_config.seed)
        torch.manual_seed(train_config.seed)
        if train_config.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
            torch.use_deterministic_algorithms(True)
        self.device = pick_device(hvd.local_rank(), hvd.local_size())
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.backends.cudnn.benchmark = not train_config.deterministic
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.gpu = self.device.type == "cuda"
        self.collectives = Collectives(hvd, lambda values: torch.tensor(values, dtype=torch.float64),
                                       lambda prefix: f"hvdtrain.{prefix}", torch.from_numpy)
        self.pipeline = GPipe.open(self, hvd, config)  # None without pipeline stages
        return self.context()

    def prepare(self, task: Any, config: Any) -> None:
        train_config, optim_config = config.train, config.optim
        self.task = task
        self.model = task.model.to(self.device)
        # Convolutions on a GPU get channels-last inputs, so cuDNN runs its NHWC kernels (what Tensor
        # Cores want) and the activations stay NHWC. The parameters keep the default layout: Horovod
        # broadcasts and allreduces only tensors that are contiguous in it (a channels-last weight or
        # gradient fails with "Tensor is required to be contiguous", seen on an H200), and a conv with
        # an NHWC input takes its weight in either layout.
        self.channels_last = self.device.type == "cuda" and any(
            isinstance(m, torch.nn.Conv2d) for m in self.model.modules())
        self._scaler_skips = torch.zeros((), dtype=torch.int64, device=self.device)
        self.accumulation = train_config.grad_accumulation
        self.grad_clip_norm = optim_config.grad_clip_norm
        self.nonfinite = train_config.nonfinite
        self.finite_check = DeferredFiniteCheck(self.device, train_config.log_every or 50) \
            if self.device.type == "cuda" and self.nonfinite == "error" else None
        # The gradient exchange (hvdtrain.core.exchange), planned once (hvdtrain.core.exchange_plan; the
        # rulebook allowed it) and built by hvdtrain.torch.exchanges: the optimizer this adapter steps,
        # the exchange, and the state keeper that knows whether the optimizer state is sharded.
        self.plan = plan_exchange(config, Workers(hvd.size(), hvd.local_size(), self.device.type == "cuda",
                                                  torch.get_num_threads(), os.cpu_count() or 1))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        wiring = exchanges.build(self.plan, config, self.model, self.params, self._fine_tuning(task, config))
        self.optimizer, self.exchange, self.optimizer_state = wiring.optimizer, wiring.exchange, wiring.state
        # the task's own LR scheduler (hvdtrain.core.optimizer_policy), stepped once per update; it drives
        # the groups in force: the optimizer that runs (hvd.DistributedOptimizer is a copy sharing the
        # groups until a load replaces them), ZeRO-2's shard optimizer, ZeRO-1's recipe optimizer
        self.scheduler = task.scheduler if self.task_lr else None
        if self.scheduler is not None:
            self.scheduler.optimizer = self.optimizer_state.scheduled(self.optimizer)
        precision = train_config.mixed_precision
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        # train.compile (hvdtrain.torch.compiled): the forward/backward compiled, the model itself saved
        self.step_model = compiled.step_module(self.model, train_config.compile, self.device.type)
        self._compile_clock = FirstStepClock(compiled.describe(train_config.compile), hvd.rank())

    control: BackboneControl | None = None  # fine-tuning controls (hvdtrain.core.finetune), set by prepare()
    freeze_epochs = 0
    plan: ExchangePlan | None = None  # the run's exchange plan, set by prepare()
    optimizer_state = WholeState()  # whole or sharded optimizer state (hvdtrain.torch.exchanges), set by prepare()
    scheduler: Any = None  # the task's own LR scheduler, set by prepare() when its LR runs

    def describe_optimizer(self, task: Any) -> OptimizerFacts | None:
        """The task's torch optimizer and LR scheduler (refused by name when they are not ones)."""
        optimizer, scheduler = task.optimizer, getattr(task, "scheduler", None)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"TrainTask.optimizer: {type_name(optimizer)} is not a torch.optim.Optimizer")
        if scheduler is not None:
            if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) or \
                    isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                raise ConfigError(f"TrainTask.scheduler: {type_name(scheduler)} is not a torch LRScheduler stepped "
                                  f"once per update (ReduceLROnPlateau needs a metric); accepted: any "
                                  f"torch.optim.lr_scheduler.LRScheduler other than ReduceLROnPlateau")
            if scheduler.optimizer is not optimizer:
                raise ConfigError("TrainTask.scheduler: it drives another optimizer than TrainTask.optimizer")
        base = optimizer.defaults.get("lr")
        return OptimizerFacts(type_name(optimizer), float(optimizer.param_groups[0]["lr"]),
                              float(base) if isinstance(base, (int, float, torch.Tensor)) else None,
                              bool(getattr(optimizer, FROM_CONFIG, False)),
                              type_name(scheduler) if scheduler is not None else None)

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])  # the groups in force (ZeRO's: see ShardedOptimizer)

    def step_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()

    def _agree_hyperparameters(self, root_rank: int) -> None:
        """Every rank takes the root's parameter-group hyperparameters (a resumed LR included)."""
        groups = self.optimizer_state.hyperparameter_groups(self.optimizer)  # sharded: the recipe optimizer's
        root = self.broadcast_object(group_settings(groups),
                                     root_rank)  # distributed
        for group, values in zip(groups, root):
            group.update(values)

    def _fine_tuning(self, task: Any, config: Any) -> torch.optim.Optimizer:
        """The recipe's optimizer, with the backbone's parameter groups at ``optim.backbone_lr_factor``
        when that is not 1; ``self.control`` for ``model.freeze_backbone_epochs``."""
        if not finetune.enabled(config):
            return task.optimizer
        self.control = BackboneControl(self.model, head_parameters(task, self.model))
        self.freeze_epochs = config.model.freeze_backbone_epochs
        factor = config.optim.backbone_lr_factor
        return task.optimizer if factor == 1.0 else self.control.split_groups(task.optimizer, factor)

    def begin_epoch(self, epoch: int) -> None:
        if self.control is not None:
            self.control.frozen = epoch < self.freeze_epochs

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @property
    def skipped_updates(self) -> int:  # type: ignore[override]
        """Updates dropped for a non-finite gradient, and those the fp16 gradient scaler skipped."""
        return self._skips + int(self._scaler_skips)

    @skipped_updates.setter
    def skipped_updates(self, value: int) -> None:
        self._skips = value

    _skips = 0
    _scaler_skips: Any = 0  # a device tensor once prepare() ran; subclasses that prepare otherwise keep 0

    def broadcast_state(self, root_rank: int = 0) -> None:
        self._agree_hyperparameters(root_rank)  # distributed
        if self.scheduler is not None:
            self.scheduler.load_state_dict(self.broadcast_object(self.scheduler.state_dict(), root_rank))
        # model parameters and optimizer state: whole, or each rank its slice of rank 0's (ZeRO)
        self.optimizer_state.broadcast(self.model, self.optimizer, root_rank, self.broadcast_object)  # distributed
        if self.scaler is not None:
            self.scaler.load_state_dict(self.broadcast_object(self.scaler.state_dict(), root_rank))

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get(LR_FACTOR, 1.0)  # optim.backbone_lr_factor's groups

    def _running_stats(self) -> list[torch.Tensor]:
        """The model's floating-point buffers (BatchNorm running means and variances), in order."""
        return [b for b in self.model.buffers() if b.is_floating_point()]

    def model_buffers(self) -> list[np.ndarray] | None:
        """This rank's own running statistics as NumPy copies (None with pipeline stages, whose
        stages average theirs in place): what a step checkpoint keeps per rank."""
        if self.pipeline is not None:
            return None
        return [b.detach().cpu().numpy().copy() for b in self._running_stats()]

    def set_model_buffers(self, values: list[np.ndarray]) -> None:
        """Put back what :meth:`model_buffers` returned."""
        with torch.no_grad():
            for buffer, value in zip(self._running_stats(), values):
                buffer.copy_(torch.from_numpy(np.asarray(value)))

    def sync_model_buffers(self) -> None:
        buffers = self._running_stats()
        if not buffers or hvd.size() == 1 or self.exchange.buffers_agree:
            return
        averaged = hvd.grouped_allreduce(buffers, op=hvd.Average, name="hvdtrain.sync_buffers")  # distributed
        with torch.no_grad():
            for buffer, value in zip(buffers, averaged):
                buffer.copy_(value)

    def gather_state(self) -> None:
        self.optimizer_state.gather()  # distributed with ZeRO: rank 0 holds the whole optimizer state to save

    def reseed(self, seed: int) -> None:
        torch.manual_seed(seed)  # CPU and every CUDA device: dropout masks

    def _to_device(self, array: Any) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else array
        if self.device.type != "cuda":
            return tensor
        if tensor.device.type == "cpu":  # batches already on the GPU (`hvdtrain bench`'s) stay where they are
            tensor = tensor.pin_memory().to(self.device, non_blocking=True)  # page-locked: a truly async copy
        if self.channels_last and tensor.dim() == 4 and tensor.is_floating_point():
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    def _move(self, inputs: Any) -> Any:
        if isinstance(inputs, dict):
            return {k: self._to_device(v) for k, v in inputs.items()}
        return self._to_device(inputs)

    step_model: Any = None  # what runs the forward: the model, or train.compile's compiled module
    _compile_clock = FirstStepClock()  # times a compiled first step (this one: eager, never reports)

    def _forward(self, inputs: Any) -> Any:
        model = self.model if self.step_model is None else self.step_model
        return model(**inputs) if isinstance(inputs, dict) else model(inputs)

    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True,
                   weight: float | None = None) -> torch.Tensor:
        self._compile_clock.start()  # train.compile: the first step compiles, timed
        self.model.train()
        if self.control is not None:
            self.control.after_train_mode()  # a frozen backbone's BatchNorm statistics stay
        inputs, targets = self._move(inputs), self._to_device(targets)
        with self._autocast():
            loss = self.task.loss_fn(self._forward(inputs), targets)
        scaled = loss * (1.0 / self.accumulation if weight is None else weight)
        self.optimizer_state.before_backward()  # ZeRO: the flat buffers backward accumulates into
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if apply_update:
            self._apply_update()
        self._compile_clock.stop()
        return loss.detach()

    def _apply_update(self) -> None:
        # distributed: the exchange leaves the gradient every rank applies in each p.grad (Adasum, which
        # combines the updates inside optimizer.step(), hands back none: nothing to check or clip)
        grads = self.exchange.reduce([p.grad for p in self.params])
        if self.control is not None and self.control.frozen:  # no update at all for a frozen backbone
            self.control.drop_frozen_grads()
            grads = [g for p, g in zip(self.params, grads) if not self.control.is_frozen(p)]
        # ZeRO-2: grads are this rank's shard of the gradient, whose findings the ranks agree on
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
            self.optimizer_state.agree_on_overflow(self.scaler)  # distributed with ZeRO-2
        grads = [g for g in grads if g is not None]
        norm = self.optimizer_state.global_norm(torch.nn.utils.get_total_norm(grads))  # distributed with ZeRO-2
        if self.scaler is None and not self._finite(norm):
            self._end_update()
            if self.nonfinite == "error":
                ago = self._bad_updates_ago or 0
                raise NonFiniteGradientError(
                    f"the allreduced gradient is not finite (norm {float(norm)})" if ago == 0 else
                    f"the allreduced gradient is not finite (the check, read every {self.finite_check.window} "
                    f"updates on a GPU, found it {ago} updates later)", updates_ago=ago)
            self._skips += 1
            return
        if self.grad_clip_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(  # the gradients the optimizer applies
                [p for group in self.optimizer.param_groups for p in group["params"]], self.grad_clip_norm, norm)
        with self.exchange.stepping():
            if self.scaler is not None:
                scale = self.scaler._scale.clone()  # the scale tensor, read without a host sync
                self.scaler.step(self.optimizer)  # skips the update itself when fp16 gradients overflowed
                self.scaler.update()  # ... and then lowers the scale: count that on the device, no sync
                self._scaler_skips += (self.scaler._scale < scale).to(torch.int64)
            else:
                self.optimizer.step()
        self._end_update()

    finite_check: DeferredFiniteCheck | None = None  # train.nonfinite=error on a GPU: read once per window
    _bad_updates_ago: int | None = None

    def _finite(self, norm: torch.Tensor) -> bool:
        """Whether this update goes ahead: per update (a host synchronisation), or under a deferred
        check noted on the device and read only when its window is due (a bad update found then
        stops the run: :attr:`_bad_updates_ago` says how many updates before this one it came)."""
        if self.finite_check is None:
            return bool(torch.isfinite(norm))
        self.finite_check.note(norm)
        if self.finite_check.due():
            self._bad_updates_ago = self.finite_check.updates_ago()
        return self._bad_updates_ago is None

    def sync_replicas(self) -> None:
        super().sync_replicas()
        # the end of an epoch: the deferred finite check is read before evaluation and the checkpoint
        if self.finite_check is not None and (ago := self.finite_check.updates_ago()) is not None:
            raise TrainingError(f"the allreduced gradient was not finite {ago} updates before the end of this "
                                f"epoch; stopped without saving it. train.nonfinite=skip drops such updates instead")

    def _end_update(self) -> None:
        """Every update ends here, applied or skipped: clear the gradients, then the exchange's
        after-update step (local SGD averages every comm.local_sgd_steps updates)."""
        self.optimizer.zero_grad()
        self.exchange.after_update()

    @torch.no_grad()
    def eval_step(self, inputs: Any, targets: Any) -> dict[str, float]:
        self.model.eval()
        inputs, targets = self._move(inputs), self._to_device(targets)
        with self._autocast():
            outputs = self._forward(inputs)
            loss = self.task.loss_fn(outputs, targets)
        count = len(targets)
        sums = {"loss_sum": loss.detach().double() * count, "count": float(count)}
        sums.update({k: v.detach().double() if torch.is_tensor(v) else float(v)
                     for k, v in self.task.metric_sums(outputs, targets).items()})
        return sums

    def rng_state(self) -> dict[str, Any]:
        return {"torch_cpu": torch.get_rng_state().tolist(),
                "torch_cuda": torch.cuda.get_rng_state().tolist() if self.device.type == "cuda" else None}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(torch.tensor(state["torch_cpu"], dtype=torch.uint8))
        if state.get("torch_cuda") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(torch.tensor(state["torch_cuda"], dtype=torch.uint8))

    def snapshot(self) -> Any:
        return copy.deepcopy((self.model.state_dict(), self.optimizer.state_dict()))

    def restore_snapshot(self, snapshot: Any) -> None:
        model_state, optimizer_state = snapshot
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(optimizer_state)

    @torch.no_grad()
    def restart_window(self, accumulation: int) -> None:
        super().restart_window(accumulation)
        for p in self.params:  # a window cut short: its gradients go (flat buffers' views stay views)
            if p.grad is not None:
                p.grad.zero_()

    def save_state(self, directory: Path) -> None:
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise NonFiniteStateError("model parameters are not finite")
        torch.save(self.model.state_dict(), Path(directory) / MODEL_FILE)
        torch.save(self.optimizer.state_dict(), Path(directory) / OPTIMIZER_FILE)
        if self.scaler is not None:
            torch.save(self.scaler.state_dict(), Path(directory) / SCALER_FILE)
        if self.scheduler is not None:
            torch.save(self.scheduler.state_dict(), Path(directory) / SCHEDULER_FILE)

    def load_state(self, directory: Path) -> None:
        # weights_only: tensors and plain containers only, never arbitrary pickled objects. Loaded to
        # the CPU: load_state_dict copies weights to their device and lets the optimizer place its state
        # (Adam's step counters stay on the CPU, as on the ranks that receive the broadcast).
        model_state = load_weights_only(Path(directory) / MODEL_FILE, map_location="cpu")
        self.model.load_state_dict(model_state)
        self.optimizer.load_state_dict(
            load_weights_only(Path(directory) / OPTIMIZER_FILE, map_location="cpu"))
        if self.scaler is not None and (Path(directory) / SCALER_FILE).is_file():
            self.scaler.load_state_dict(load_weights_only(Path(directory) / SCALER_FILE))
        if self.scheduler is not None:
            path = Path(directory) / SCHEDULER_FILE
            if not path.is_file():
                raise ValueError(f"{path} is missing: the checkpoint was written by a run without the task's LR "
                                 f"scheduler {type_name(self.scheduler)}; resume with the task that wrote it")
            self.scheduler.load_state_dict(load_weights_only(path, map_location="cpu"))




def pick_device(local_rank: int, local_size: int) -> torch.device:
    """``cuda:local_rank`` when this process sees a GPU per local worker; the one GPU it sees when
    the launcher gave each process its own (SLURM ``--gpus-per-task=1``); the CPU without GPUs."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return torch.device("cpu")
    return torch.device("cuda", local_rank if count >= local_size else local_rank % count)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Parameter groups: weight decay on weights, none on biases and normalisation scales/shifts
    (every parameter of at most one dimension)."""
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(params: Any, optim_config: Any) -> torch.optim.Optimizer:
    """The torch optimizer an :class:`~hvdtrain.core.config.OptimConfig` names, marked as built from
    ``optim.*``: hvdtrain's schedule sets its LR before every update
    (:mod:`hvdtrain.core.optimizer_policy`). ``params`` may be parameters or parameter groups (:func:`decay_groups`).
    Weight decay: coupled L2 for ``sgd`` and ``adam`` (added to the gradient), decoupled for
    ``adamw`` (``lr * weight_decay * weight`` subtracted), the same as the Keras side."""
    name, lr, wd = optim_config.name, optim_config.lr, optim_config.weight_decay
    if name == "sgd":
        return mark_from_config(torch.optim.SGD(params, lr=lr, momentum=optim_config.momentum, weight_decay=wd))
    if name == "adam":
        return mark_from_config(torch.optim.Adam(params, lr=lr, weight_decay=wd))
    if name == "adamw":
        return mark_from_config(torch.optim.AdamW(params, lr=lr, weight_decay=wd))
    raise ConfigError(f"optim.name: {name!r} is not allowed; choose one of: sgd, adam, adamw")
