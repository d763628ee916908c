"""The rulebook: every rule about which settings may run together, in one place.

Each config section checks its own keys (types, choices, ranges and a section's ``check()``, in
:mod:`hvdtrain.core.config`). What is left are the rules that span sections, or that need to know
the job: the world size, whether Horovod runs on MPI, whether there is a GPU, what the launcher
exported. Each rule is a function that returns its *refusal* (one line naming the keys involved and
what to do) or None; :func:`refusal` returns the first one that applies and :func:`check` raises it
as a :class:`~hvdtrain.core.config.ConfigError`.

The rules that read only the config run where the config is resolved (before anything is launched:
``hvdtrain recipe``, :func:`hvdtrain.run`, :func:`hvdtrain.core.resolve.load_config`) and again
in :class:`~hvdtrain.core.loop.Trainer` before training; the rules that need the job run there too,
right after Horovod is initialised (``world`` given), on every rank alike, before any model is built.

docs/concepts/combinations.md, "What combines with what", is this module read as a table (docs/generate.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from hvdtrain.core import batching, early_stop, finetune, reproducible
from hvdtrain.core.compiled import TORCH_ONLY_MODES, compiling
from hvdtrain.core.config import ConfigError

COMPRESSORS = ("powersgd", "topk")  # hvdtrain's own exchanges (the others are Horovod's allreduce)


@dataclass(frozen=True)
class World:
    """What the rules need to know about the job this process is in."""

    size: int = 1
    mpi: bool = False  # Horovod's controller is MPI (else Gloo)
    gpu: bool = False  # this process trains on a GPU
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def fp16_allreduce(config: Any) -> bool:
    """Whether gradients travel as float16: ``comm.compression=fp16``, or its older spelling
    ``train.fp16_allreduce=true`` (kept as an alias; with PowerSGD or top-k their factors or values
    travel as float16). The one place that resolves the alias: :func:`hvdtrain.core.exchange_plan.plan_exchange`
    calls it and everything else reads the plan's ``fp16_wire``."""
    return config.comm.compression == "fp16" or config.train.fp16_allreduce


def _exchange_key(config: Any) -> str | None:
    """The key that selects hvdtrain's own gradient exchange (compression or local SGD), as
    ``key=value``, or None when Horovod's allreduce runs (plain or fp16)."""
    comm = config.comm
    if comm.compression in COMPRESSORS:
        return f"comm.compression={comm.compression}"
    if comm.local_sgd_steps > 1:
        return f"comm.local_sgd_steps={comm.local_sgd_steps}"
    return None


def _fp16_key(config: Any) -> str:
    """The key the user set for fp16 on the wire (the alias is named when it was the one set)."""
    return "train.fp16_allreduce=true" if config.train.fp16_allreduce else "comm.compression=fp16"


# -- rules that read only the config -------------------------------------------------------------

def adasum_with_exchange(config: Any) -> str | None:
    """Adasum combines whole updates; compression and local SGD average."""
    exchange = _exchange_key(config)
    if config.comm.reduction == "adasum" and exchange:
        return (f"{exchange} cannot be combined with comm.reduction=adasum (Adasum combines whole updates, the "
                f"compressed exchange averages); use comm.reduction=average")
    return None


def adasum_with_elastic(config: Any) -> str | None:
    """Elastic jobs run on Gloo; Horovod's Adasum on CPU needs MPI."""
    if config.comm.reduction == "adasum" and config.train.elastic:
        return ("comm.reduction=adasum cannot be combined with train.elastic=true: Horovod's elastic mode runs on "
                "Gloo and Adasum needs the MPI controller; use comm.reduction=average")
    return None


def adasum_with_update_rewrites(config: Any) -> str | None:
    """torch's Adasum combines each worker's optimizer update, so the gradient is never seen whole."""
    if config.comm.reduction != "adasum" or config.framework != "torch":
        return None
    if config.optim.grad_clip_norm is not None or config.train.mixed_precision == "fp16":
        return ("comm.reduction: 'adasum' combines each worker's optimizer update, so torch cannot also "
                "use optim.grad_clip_norm or train.mixed_precision=fp16 (gradient scaling); unset those "
                "or use comm.reduction=average")
    return None


def local_sgd_with_compression(config: Any) -> str | None:
    """Local SGD exchanges parameters, not gradients: nothing to compress."""
    comm = config.comm
    if comm.local_sgd_steps > 1 and (comm.compression != "none" or config.train.fp16_allreduce):
        other = f"comm.compression={comm.compression}" if comm.compression in COMPRESSORS else _fp16_key(config)
        return (f"comm.local_sgd_steps={comm.local_sgd_steps} exchanges parameters, not gradients, so it cannot be "
                f"combined with {other}; use comm.compression=none and train.fp16_allreduce=false, or "
                f"comm.local_sgd_steps=1")
    return None


def error_feedback_with_loss_scaling(config: Any) -> str | None:
    """An overflowing fp16 loss scale would fill the error-feedback buffers with inf."""
    method = config.comm.compression
    if method in COMPRESSORS and config.train.mixed_precision == "fp16":
        return (f"comm.compression={method} keeps error-feedback buffers that an overflowing fp16 loss scale would "
                f"fill with inf; use train.mixed_precision=bf16 or none, or comm.compression=fp16")
    return None


def overlap_with_exchange(config: Any) -> str | None:
    """hvdtrain's own exchanges, pipeline stages and the sharded optimizer reduce after the backward
    pass: nothing overlaps."""
    if config.comm.overlap != "always":
        return None
    what = _exchange_key(config) or (f"parallel.pipeline_stages={config.parallel.pipeline_stages}"
                                     if config.parallel.pipeline_stages > 1 else None) or (
        f"parallel.shard_optimizer={config.parallel.shard_optimizer}"
        if config.parallel.shard_optimizer != "none" else None)
    if what:
        return (f"comm.overlap=always cannot be honoured with {what}: its gradients are exchanged after the "
                f"backward pass, not during it; use comm.overlap=auto or never")
    return None


def elastic_with_tuning(config: Any) -> str | None:
    """Horovod crashes (a segmentation fault in its parameter manager) when an elastic job re-forms
    with autotune or the timeline on (Horovod issue "segmentation fault when elastic training and
    --autotune")."""
    if not config.train.elastic:
        return None
    for key, on in (("comm.autotune=true", config.comm.autotune), (f"comm.timeline={config.comm.timeline}",
                                                                     config.comm.timeline)):
        if on:
            return (f"{key} cannot be combined with train.elastic=true: Horovod 0.28 crashes with a segmentation "
                    f"fault when an elastic job runs with autotune or the timeline; turn one of them off")
    return None


def pipeline_with_elastic(config: Any) -> str | None:
    """Horovod's process sets do not survive an elastic reset."""
    if config.parallel.pipeline_stages > 1 and config.train.elastic:
        return ("parallel.pipeline_stages>1 cannot run with train.elastic=true: Horovod's process sets do not "
                "survive an elastic reset; turn one of them off")
    return None


def pipeline_with_exchange(config: Any) -> str | None:
    """Pipeline stages average each stage's gradients over its replicas with Horovod's allreduce
    (float16 on the wire when asked); hvdtrain's own exchanges are not run per stage."""
    exchange = _exchange_key(config)
    if config.parallel.pipeline_stages > 1 and exchange:
        return (f"parallel.pipeline_stages={config.parallel.pipeline_stages} cannot be combined with {exchange}: "
                f"pipeline stages exchange gradients with Horovod's allreduce only; use comm.compression=none or "
                f"fp16 and comm.local_sgd_steps=1, or parallel.pipeline_stages=1")
    return None


def pipeline_with_accumulation(config: Any) -> str | None:
    """The pipeline's micro-batches already sum into one update."""
    if config.parallel.pipeline_stages > 1 and config.train.grad_accumulation != 1:
        return (f"train.grad_accumulation={config.train.grad_accumulation} is not supported with pipeline stages; "
                f"use parallel.micro_batches (the update already sums all micro-batches)")
    return None


def pipeline_with_adasum(config: Any) -> str | None:
    """Stages average over their replicas."""
    if config.parallel.pipeline_stages > 1 and config.comm.reduction != "average":
        return (f"comm.reduction={config.comm.reduction!r} is not supported with pipeline stages; "
                f"use comm.reduction=average")
    return None


def pipeline_with_mixed_precision(config: Any) -> str | None:
    """No loss scaler across stages; TensorFlow's stages run in float32 only."""
    if config.parallel.pipeline_stages <= 1:
        return None
    precision = config.train.mixed_precision
    if precision == "fp16":
        return "train.mixed_precision=fp16 is not supported with pipeline stages; use bf16 or none"
    if precision != "none" and config.framework == "tensorflow":
        return (f"train.mixed_precision={precision} is not supported with pipeline stages in TensorFlow; "
                f"use none")
    return None


def pipeline_micro_batches(config: Any) -> str | None:
    """Every micro-batch needs a sample."""
    parallel = config.parallel
    if parallel.pipeline_stages > 1 and config.train.batch_size < parallel.micro_batches:
        return (f"parallel.micro_batches={parallel.micro_batches} is more than train.batch_size="
                f"{config.train.batch_size}; every micro-batch needs at least one sample")
    return None


def _finetune_keys(config: Any) -> str:
    keys = []
    if config.model.freeze_backbone_epochs > 0:
        keys.append(f"model.freeze_backbone_epochs={config.model.freeze_backbone_epochs}")
    if config.optim.backbone_lr_factor != 1.0:
        keys.append(f"optim.backbone_lr_factor={config.optim.backbone_lr_factor:g}")
    return " and ".join(keys)


def pipeline_with_finetune(config: Any) -> str | None:
    """The stages' driver takes the training step over: it would not freeze or scale the backbone."""
    if config.parallel.pipeline_stages > 1 and finetune.enabled(config):
        return (f"{_finetune_keys(config)} is not supported with pipeline stages yet; "
                f"set model.freeze_backbone_epochs=0 and optim.backbone_lr_factor=1, or train without stages")
    return None


def adasum_with_finetune(config: Any) -> str | None:
    """Adasum reduces the update, not the gradient: a frozen or scaled backbone is not its input."""
    if config.comm.reduction == "adasum" and finetune.enabled(config):
        return f"{_finetune_keys(config)} cannot be combined with comm.reduction='adasum'; use comm.reduction=average"
    return None


def sharded_optimizer_with(config: Any) -> str | None:
    """The sharded optimizer (ZeRO-1 ``optimizer``, ZeRO-2 ``gradients``) updates a flat slice of every
    parameter group from the averaged gradients (ZeRO-2: reduce-scattered) and all-gathers the result:
    it needs the averaged gradient itself, the whole model on every rank and a fixed set of ranks."""
    mode = config.parallel.shard_optimizer
    if mode == "none":
        return None
    key = f"parallel.shard_optimizer={mode}"
    stages, exchange = config.parallel.pipeline_stages, _exchange_key(config)
    conflicts = (  # comm.overlap=always: overlap_with_exchange
        (stages > 1, f"parallel.pipeline_stages={stages}", "each stage updates its own part of the model"),
        (exchange, exchange, "the sharded update needs the averaged gradient itself"),
        (config.comm.reduction == "adasum", "comm.reduction=adasum", "Adasum combines whole updates"),
        (config.train.elastic, "train.elastic=true", "a re-formed job would have to re-shard the optimizer state "
                                                     "in memory"),
        (config.model.freeze_backbone_epochs > 0, f"model.freeze_backbone_epochs={config.model.freeze_backbone_epochs}",
         "the flat slices update every parameter, a frozen backbone's too"),
    )
    for clash, other, why in conflicts:
        if clash:
            return f"{key} cannot be combined with {other}: {why}; use parallel.shard_optimizer=none, or drop {other}"
    return None


def compile_with_pipeline(config: Any) -> str | None:
    """Pipeline stages run their own step (each stage's forward and backward per micro-batch);
    ``train.compile`` compiles the data-parallel step only."""
    if compiling(config) and config.parallel.pipeline_stages > 1:
        return (f"train.compile={config.train.compile} cannot be combined with parallel.pipeline_stages="
                f"{config.parallel.pipeline_stages}: pipeline stages run their own uncompiled step; use "
                f"train.compile=none, or parallel.pipeline_stages=1")
    return None


def compile_mode_with_tensorflow(config: Any) -> str | None:
    """``reduce-overhead`` and ``max-autotune`` are torch.compile modes; TensorFlow compiles with
    XLA one way only, and running it under a mode's name would claim what does not happen."""
    mode = config.train.compile
    if config.framework == "tensorflow" and mode in TORCH_ONLY_MODES:
        return (f"train.compile={mode} is a torch.compile mode; TensorFlow compiles the step with XLA "
                f"(jit_compile) only: use train.compile=default (or none) with --framework tensorflow")
    return None


def early_stopping_metric(config: Any) -> str | None:
    """Early stopping watches a metric every rank agrees on (``train_loss`` or ``val_*``: computed
    from allreduced values), so all ranks stop after the same epoch; it needs one to watch. Whether
    the recipe reports that metric is known at a resume (the history) or the first epoch's end."""
    return early_stop.config_refusal(config)


def global_batch_micro_batches(config: Any) -> str | None:
    """A fixed global batch is cut into whole micro-batches of ``train.batch_size``, and an explicit
    ``train.grad_accumulation`` must divide their number (:mod:`hvdtrain.core.batching`)."""
    return batching.config_refusal(config.train)


def reproducible_with(config: Any) -> str | None:
    """Bitwise mode (``train.reproducible=world-size``, :mod:`hvdtrain.core.reproducible`) needs a
    fixed global batch and sums every micro-batch's gradient along one fixed tree: what combines
    gradients another way (compression, Adasum, local SGD, ZeRO, pipeline stages), fp16 loss
    scaling, overlap and compiled steps do not keep the guarantee (an elastic re-form keeps it: the
    same micro-batches, re-dealt, :mod:`hvdtrain.core.elastic`)."""
    return reproducible.refusal(config)


CONFIG_RULES: tuple[Callable[[Any], str | None], ...] = (
    adasum_with_exchange, adasum_with_elastic, adasum_with_update_rewrites, local_sgd_with_compression,
    error_feedback_with_loss_scaling, overlap_with_exchange, elastic_with_tuning, pipeline_with_elastic,
    pipeline_with_exchange, pipeline_with_accumulation, pipeline_with_adasum, pipeline_with_mixed_precision,
    pipeline_micro_batches, early_stopping_metric, pipeline_with_finetune, adasum_with_finetune,
    sharded_optimizer_with, compile_with_pipeline, compile_mode_with_tensorflow, global_batch_micro_batches,
    reproducible_with,
)


# -- rules that need the job ---------------------------------------------------------------------

def stages_divide_world(config: Any, world: World) -> str | None:
    """An S x R grid needs a world size that S divides."""
    stages = config.parallel.pipeline_stages
    if stages > 1 and world.size % stages:
        return (f"parallel.pipeline_stages={stages} does not divide the world size {world.size}; launch a "
                f"multiple of {stages} workers or choose a divisor of {world.size}")
    return None


def adasum_needs_mpi(config: Any, world: World) -> str | None:
    """Horovod 0.28 implements Adasum on CPU only over MPI, and only for a power-of-2 world."""
    if config.comm.reduction != "adasum" or world.size == 1:
        return None
    if not world.mpi:
        return ("comm.reduction: 'adasum' needs Horovod's MPI controller (horovodrun --mpi or mpirun); this job "
                "runs on Gloo. Use comm.reduction=average or launch with MPI")
    if world.size & (world.size - 1):
        return f"comm.reduction: 'adasum' needs a power-of-2 number of workers, this job has {world.size}"
    return None


def fp16_needs_gpu(config: Any, world: World) -> str | None:
    """float16 autocast with a loss scaler is a GPU feature; CPUs have bf16."""
    if config.train.mixed_precision == "fp16" and not world.gpu:
        return "train.mixed_precision: 'fp16' needs a GPU; use 'bf16' on CPU"
    return None


def elastic_with_launcher_tuning(config: Any, world: World) -> str | None:
    """The same crash as :func:`elastic_with_tuning`, when the launcher turned tuning on
    (``horovodrun --autotune`` / ``--timeline-filename`` export these variables)."""
    if not config.train.elastic:
        return None
    for name in ("HOROVOD_AUTOTUNE", "HOROVOD_TIMELINE"):
        value = world.environ.get(name, "")
        if value and value not in ("0", "false", "False"):
            return (f"{name}={value} (set by the launcher or the environment) cannot be combined with "
                    f"train.elastic=true: Horovod 0.28 crashes with a segmentation fault when an elastic job runs "
                    f"with autotune or the timeline; unset {name}")
    return None


def cuda_graphs_with_accumulation(config: Any, world: World) -> str | None:
    """On a GPU, torch.compile's ``reduce-overhead`` and ``max-autotune`` replay the step as CUDA
    graphs, which reuse their output memory at the next replay: gradients summed over several
    micro-batches live in it (PyTorch stops with "accessing tensor output of CUDAGraphs that has
    been overwritten", measured on an H100 with PyTorch 2.11)."""
    mode, micro = config.train.compile, config.train.grad_accumulation
    if world.gpu and config.framework == "torch" and mode in TORCH_ONLY_MODES and micro > 1:
        return (f"train.compile={mode} cannot be combined with train.grad_accumulation={micro} on a GPU: the mode "
                f"replays the step as CUDA graphs, which overwrite the memory the micro-batches' gradients "
                f"accumulate in; use train.compile=default, or train.grad_accumulation=1")
    return None


def global_batch_divides_world(config: Any, world: World) -> str | None:
    """A fixed global batch's micro-batches are shared equally by the data-parallel workers
    (:func:`hvdtrain.core.batching.global_batch_refusal` names the world sizes that can), and an
    explicit ``train.grad_accumulation`` must be the one that follows."""
    stages = max(1, config.parallel.pipeline_stages)
    replicas = max(1, world.size // stages)
    problem = batching.global_batch_refusal(config.train, replicas)
    if problem or config.train.global_batch_size is None or stages == 1:
        return problem
    plan = batching.plan_for(config.train, replicas)
    accumulation = plan.accumulation
    if accumulation != 1:  # pipeline stages split each micro-batch themselves and accumulate nothing
        return (f"train.global_batch_size={config.train.global_batch_size} with parallel.pipeline_stages={stages} on "
                f"{world.size} workers accumulates {accumulation} micro-batches of train.batch_size="
                f"{plan.micro_batch} per replica, which pipeline stages do not; make the global batch "
                f"batch_size x {replicas} replicas, or leave train.global_batch_size unset")
    return None


WORLD_RULES: tuple[Callable[[Any, World], str | None], ...] = (
    stages_divide_world, global_batch_divides_world, adasum_needs_mpi, fp16_needs_gpu, elastic_with_launcher_tuning,
    cuda_graphs_with_accumulation,
)


def refusal(config: Any, world: World | None = None) -> str | None:
    """Why ``config`` cannot run (one line), or None. Without ``world`` only the config's own
    rules are asked; with it, the job's too."""
    for rule in CONFIG_RULES:
        problem = rule(config)
        if problem:
            return problem
    for job_rule in WORLD_RULES if world is not None else ():
        problem = job_rule(config, world)
        if problem:
            return problem
    return None


def check(config: Any, world: World | None = None) -> None:
    """Raise :class:`~hvdtrain.core.config.ConfigError` with :func:`refusal`'s reason, if any."""
    problem = refusal(config, world)
    if problem:
        raise ConfigError(problem)


def check_job(config: Any, ctx: Any) -> None:
    """Every rule, the job's included, for a process whose Horovod is initialised (``ctx``: its
    :class:`~hvdtrain.core.adapter.DistContext`); what every entry point that trains calls right
    after the adapter's ``init`` (the trainer, ``hvdtrain bench``)."""
    check(config, World(ctx.size, ctx.mpi, ctx.gpu))


def check_task(task: Any, config: Any) -> None:
    """Raise :class:`~hvdtrain.core.config.ConfigError` with :func:`task_refusal`'s reason, if any."""
    problem = task_refusal(task, config)
    if problem:
        raise ConfigError(problem)


def task_refusal(task: Any, config: Any) -> str | None:
    """Why the recipe's task cannot run with ``config`` (after the recipe built it), or None:
    pipeline stages need a model that says how it splits, and a recipe that exports its model
    needs the final checkpoint to assemble the stages on rank 0."""
    stages = config.parallel.pipeline_stages
    if stages <= 1:
        return None
    if task.pipeline_blocks is None:
        return (f"parallel.pipeline_stages={stages}: recipe {config.recipe!r} with model {config.model.name!r} "
                f"does not say how its model splits into stages (TrainTask.pipeline_blocks); use "
                f"parallel.pipeline_stages=1")
    if task.export is not None and not config.checkpoint.enabled:
        return (f"parallel.pipeline_stages={stages} with checkpoint.enabled=false: recipe {config.recipe!r} "
                f"exports its trained model, which rank 0 assembles from the stages with the final checkpoint; "
                f"set checkpoint.enabled=true")
    return None
