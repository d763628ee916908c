"""The config's schema: its sections and their keys, each with a default, help text and, where it
has them, allowed choices or a range (the field metadata :func:`option` declares).

What a run can be told and nothing about how it is read: :mod:`hvdtrain.core.config_loader` reads
files and overrides into these dataclasses and checks every key against this metadata; the
reference page (``docs/reference/config.md``) is generated from it. Recipes add sections of their
own (:class:`Schema`), declared with :func:`option` exactly like the core's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hvdtrain.core.config_error import ConfigError, short

FRAMEWORKS = ("torch", "tensorflow")


@dataclass(frozen=True)
class Schema:
    """What the recipe in force adds to the core's keys, handed in by the caller (this module
    knows no recipe): its own ``sections`` (name -> dataclass), the old spellings of keys it moved
    into them (``moved_keys``: old dotted key -> new), and, for error messages, what other known
    recipes declare (``foreign_sections``: section -> recipe names) and moved
    (``foreign_moves``: old -> (new, recipe))."""

    sections: dict[str, type] = field(default_factory=dict)
    moved_keys: dict[str, str] = field(default_factory=dict)
    foreign_sections: dict[str, tuple[str, ...]] = field(default_factory=dict)
    foreign_moves: dict[str, tuple[str, str]] = field(default_factory=dict)


RESUME_KINDS = ("state", "data")


def _f(default: Any, help: str, *, choices: tuple | None = None, min: float | None = None,
       max: float | None = None, min_exclusive: bool = False, resume: str | None = None) -> Any:
    """A dataclass field with help text and validation metadata. ``resume``: a key whose change
    makes a checkpoint unusable, so ``--resume`` refuses it naming the key: ``"state"`` (the saved
    model or optimizer state means something else) or ``"data"`` (the samples or their order
    change, so the saved position would skip or repeat samples); see :func:`resume_keys`."""
    if resume not in (None, *RESUME_KINDS):
        raise ValueError(f"resume={resume!r}: choose one of {RESUME_KINDS} or None")
    meta = {"help": help, "choices": choices, "min": min, "max": max, "min_exclusive": min_exclusive,
            "resume": resume}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def option(default: Any, help: str, *, choices: tuple | None = None, min: float | None = None,
           max: float | None = None, min_exclusive: bool = False, resume: str | None = None) -> Any:
    """A config field for a recipe's own section, declared exactly like the core's: a default, its
    help text and, optionally, allowed ``choices`` or a ``min``/``max`` range (checked by
    :func:`validate` in the same pass as the core's), and ``resume="state"|"data"`` for a key that
    ``--resume`` must not see changed (see :func:`_f`)."""
    return _f(default, help, choices=choices, min=min, max=max, min_exclusive=min_exclusive, resume=resume)


@dataclass
class DataConfig:
    """Where the data comes from and how much of it is used."""

    path: str | None = _f(None, "dataset root (recipe-specific); None uses the recipe's embedded default",
                          resume="data")
    max_train_samples: int | None = _f(None, "cap on training samples (quick runs)", min=1, resume="data")
    max_val_samples: int | None = _f(None, "cap on validation samples (quick runs)", min=1)
    remainder: str = _f("pad", "what to do when the training set does not divide by the world size: "
                        "'pad' repeats the first samples of the shuffled order, 'drop' leaves the last ones out",
                        choices=("pad", "drop"), resume="data")
    shuffle: bool = _f(True, "reshuffle the training order every epoch (deterministic from seed and epoch)",
                       resume="data")
    prefetch_batches: int = _f(2, "batches prepared ahead of time by a background thread (or by the data workers)",
                               min=0)
    workers: int | None = _f(None, "processes per rank that read and collate the items of a map-style Dataset "
                             "or a Hugging Face dataset, whole batches each, in order; None: the cores each local "
                             "rank can have, at most 4; 0: the background thread reads them", min=0)
    stream_max_gib: float = _f(4.0, "memory a stream (a torch IterableDataset, an unbatched tf.data.Dataset) may "
                               "hold on each rank once read into memory, in Python's object sizes (containers, "
                               "scalars and array headers counted)", min=0.0, min_exclusive=True)
    stream_max_elements: int = _f(50_000_000, "elements a stream may yield (it is read into memory on every rank; "
                                  "one that never ends is refused at this count)", min=1)


@dataclass
class ModelConfig:
    """Which model the recipe builds."""

    name: str = _f("small_cnn", "model architecture (recipe-specific; image-classification: "
                   "small_cnn, resnet18, resnet34, resnet50, resnet101 or a local Hugging Face image model "
                   "directory; bert-finetune: a Hugging Face model directory or hub name)",
                   resume="state")
    num_classes: int | None = _f(None, "number of classes; None infers it from the data", min=2, resume="state")
    pretrained: str | None = _f(None, "weights file the model starts from (image-classification: torchvision-layout "
                                "ResNet .pth or .safetensors); its keys must match the model's", resume="state")
    freeze_backbone_epochs: int = _f(0, "fine-tuning: train only the classification head for the first N epochs",
                                     min=0)


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule."""

    name: str = _f("sgd", "optimizer", choices=("sgd", "adam", "adamw"), resume="state")
    lr: float = _f(0.01, "base learning rate for one worker before scaling by world size", min=0.0,
                   min_exclusive=True)
    momentum: float = _f(0.9, "SGD momentum", min=0.0, max=1.0)
    weight_decay: float = _f(0.0, "weight decay, the same in both frameworks: coupled L2 (added to the gradient) "
                             "for sgd and adam, decoupled (lr * weight_decay * weight) for adamw", min=0.0)
    lr_scaling: str = _f("auto", "how the base LR grows with the local batches one update averages (workers x "
                         "train.grad_accumulation = n): 'linear' (lr * n), 'sqrt' (lr * sqrt(n)), 'none', or "
                         "'auto': linear for sgd, sqrt for adam and adamw",
                         choices=("auto", "linear", "sqrt", "none"))
    warmup_epochs: float = _f(0.0, "epochs of linear warmup from the base LR to the scaled LR", min=0.0)
    decay: str = _f("cosine", "LR decay after warmup", choices=("cosine", "linear", "constant"))
    min_lr_ratio: float = _f(0.0, "final LR as a fraction of the peak LR", min=0.0, max=1.0)
    grad_clip_norm: float | None = _f(None, "clip the global gradient norm to this value", min=0.0,
                                      min_exclusive=True)
    backbone_lr_factor: float = _f(1.0, "fine-tuning: the backbone's learning rate as a fraction of the head's "
                                   "(the classification head always gets the full rate)", min=0.0,
                                   resume="state")
    schedule: str = _f("auto", "who sets the LR: 'auto' runs hvdtrain's schedule (lr scaled, warmup, decay) for an "
                       "optimizer built from optim.* (build_optimizer) and leaves the task's own optimizer and "
                       "scheduler as given; 'hvdtrain' runs it on the task's optimizer too (base LR: the "
                       "optimizer's); 'task' never sets the LR", choices=("auto", "hvdtrain", "task"))
    ran: str = _f("", "written by the trainer into config.yaml: the task's own optimizer (and scheduler) that "
                  "ran; ignored when read")


@dataclass
class TrainConfig:
    """The training loop and its distributed options."""

    epochs: int = _f(1, "number of epochs", min=1)
    batch_size: int = _f(64, "batch size per worker, the micro-batch of one forward and backward (the global batch is batch_size * "
                         "world size * grad_accumulation, unless train.global_batch_size fixes it)", min=1,
                         resume="state")
    seed: int = _f(42, "seed for model init, shuffling and augmentation", min=0, max=2**32 - 1,  # NumPy's limit
                   resume="data")
    max_steps: int | None = _f(None, "stop after this many optimizer updates (counted across resumes), or when "
                               "train.epochs end if that comes first; a stop inside an epoch evaluates it and writes "
                               "checkpoint step-N there, from which a resume with a larger max_steps goes on at the "
                               "next sample. hvdtrain's LR schedule spans the updates the run takes", min=1)
    grad_accumulation: int = _f(1, "micro-batches whose gradients are summed before one allreduce and "
                                "update (Horovod's backward_passes_per_step)", min=1, resume="state")
    global_batch_size: int | None = _f(None, "samples per optimizer update across all workers, the same at any "
                                       "world size (None: batch_size x workers x grad_accumulation). batch_size is "
                                       "then the micro-batch a worker computes at once and the accumulation follows: "
                                       "global_batch_size / (batch_size x workers); a world size that does not "
                                       "divide global_batch_size / batch_size is refused. With batch_size not set "
                                       "by you, it follows: global_batch_size / (workers x grad_accumulation), "
                                       "except in bitwise mode and elastic jobs. Update k takes the same "
                                       "samples at any world size (docs: guides/world-size)", min=1, resume="data")
    fp16_allreduce: bool = _f(False, "older spelling of comm.compression=fp16 (kept as an alias): gradients travel "
                              "as float16; with comm.compression=powersgd or topk, their factors or values do")
    mixed_precision: str = _f("none", "autocast compute precision", choices=("none", "bf16", "fp16"))
    threads: int | None = _f(None, "intra-op threads per worker; None shares the cores among local workers",
                             min=1)
    log_every: int = _f(50, "print a progress line every N steps on rank 0 (0: never)", min=0)
    tensorboard: bool = _f(True, "older switch for TensorBoard (log.trackers is the one that names trackers): false "
                           "turns TensorBoard's event files off even when log.trackers names it")
    progress_bar: bool = _f(True, "rank 0 shows a progress bar with throughput and ETA when stdout is a terminal "
                            "(never in logs or pipes)")
    nonfinite: str = _f("error", "on a NaN or infinite gradient: 'error' stops naming the step, 'skip' drops "
                        "that update (all ranks agree: the check runs on the allreduced gradient)",
                        choices=("error", "skip"))
    stall_timeout_sec: float | None = _f(None, "end the job with an error naming the ranks that did not arrive "
                                         "when no step finishes for this long (must exceed the longest "
                                         "checkpoint write or evaluation)", min=1.0)
    elastic: bool = _f(False, "Horovod elastic mode (launch with horovodrun --min-np/--max-np and a host "
                       "discovery script): survivors of a failed worker continue, returning hosts rejoin")
    elastic_commit_every: int = _f(20, "elastic mode: commit the in-memory state every N optimizer steps "
                                   "(work since the last commit is redone after a failure)", min=1)
    reproducible: str = _f("none", "'world-size': the weights after every update are bit for bit the same on any "
                           "world size that divides train.global_batch_size / train.batch_size (needs "
                           "train.global_batch_size; micro-batches computed alone with fixed threads and "
                           "deterministic kernels, dropout keyed by update and micro-batch, gradients and BatchNorm "
                           "statistics summed along one fixed tree; torch and TensorFlow; docs: guides/world-size). "
                           "'none': the usual allreduce", choices=("none", "world-size"))
    deterministic: bool = _f(False, "ask the framework for deterministic kernels (bitwise reproducible runs)")
    compile: str = _f("none", "compile the training step: 'none' runs it eagerly; 'default', 'reduce-overhead' or "
                      "'max-autotune' compile the model's forward and backward with torch.compile in that mode "
                      "(Horovod's gradient hooks and every comm exchange run unchanged around it); TensorFlow "
                      "compiles the forward and gradient with XLA (jit_compile) for 'default' (the other two are "
                      "torch modes). Checkpoints are the same either way",
                      choices=("none", "default", "reduce-overhead", "max-autotune"))
    early_stopping: int | None = _f(None, "stop when early_stopping_metric has not improved by more than "
                                    "early_stopping_min_delta for this many epochs (None: never); every rank "
                                    "stops after the same epoch", min=1)
    early_stopping_metric: str | None = _f(None, "the metrics.jsonl value early stopping watches (None: "
                                           "checkpoint.best_metric)")
    early_stopping_mode: str | None = _f(None, "whether a larger or smaller metric is better (None: "
                                         "checkpoint.best_mode when the metric is checkpoint.best_metric, "
                                         "else min for a metric named *loss*, max otherwise)", choices=(None, "max", "min"))
    early_stopping_min_delta: float = _f(0.0, "the smallest change that counts as an improvement", min=0.0)


@dataclass
class CheckpointConfig:
    """Rank-0 checkpointing."""

    keep_last: int = _f(3, "checkpoints kept; older ones are deleted after a new one is safely written", min=1)
    resume: bool | str = _f(False, "continue from the latest checkpoint in the output directory: true (--resume), "
                            "false (an output an earlier run used is refused), or 'auto' (--resume auto: continue when "
                            "the output holds this run's checkpoints, start when it is unused, refuse another run's; "
                            "what a requeued Slurm job or a restarted pod needs)", choices=(False, True, "auto"))
    preempt_signals: str = _f("USR1,TERM", "signals that make every rank stop within about a second (at an optimizer step) after a "
                              "step checkpoint, exiting 75 (Slurm's --signal before a time limit or preemption, "
                              "Kubernetes' eviction): comma-separated names from USR1, USR2, TERM, INT, HUP, XCPU; "
                              "'none': signals act as without hvdtrain. Not in elastic runs (the elastic driver "
                              "stops workers by signal)")
    enabled: bool = _f(True, "write a checkpoint at the end of every epoch")
    every_steps: int = _f(0, "also checkpoint every N optimizer steps inside an epoch (0: only at epoch ends); "
                          "a resume continues at the next unseen batch", min=0)
    best_metric: str | None = _f("val_accuracy", "validation metric whose best checkpoint is kept beyond keep_last "
                                 "(None: keep only the last ones)")
    best_mode: str = _f("max", "whether a larger or smaller best_metric is better", choices=("max", "min"))

    def check(self) -> None:
        """Every name in ``preempt_signals`` is a signal hvdtrain may catch (or the list is ``none``)."""
        preempt_signal_names(self.preempt_signals)


PREEMPT_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "XCPU")


def _name_list(value: str | None, allowed: tuple[str, ...], key: str, what: str, spell) -> list[str]:
    """A comma-separated list of names from ``allowed`` (each spelled by ``spell``), each once, in
    the order given; ``none`` or empty: none. An unknown name is a :class:`ConfigError` naming
    ``key`` and the allowed names."""
    names = [spell(part.strip()) for part in (value or "").split(",") if part.strip()]
    if names == [spell("none")]:
        return []
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ConfigError(f"{key}: {unknown[0]!r} is not {what}; choose from {', '.join(allowed)} "
                          f"(comma-separated) or none")
    return list(dict.fromkeys(names))


def preempt_signal_names(value: str | None) -> list[str]:
    """``checkpoint.preempt_signals`` as signal names without ``SIG`` (``none`` or empty: none); an
    unknown name is a :class:`ConfigError` naming the allowed ones."""
    return _name_list(value, PREEMPT_SIGNALS, "checkpoint.preempt_signals", "a signal hvdtrain stops on",
                      lambda name: name.upper().removeprefix("SIG"))


TRACKER_NAMES = ("tensorboard", "mlflow", "wandb")


def tracker_names(value: str | None) -> list[str]:
    """``log.trackers`` as the tracker names in the order given, each once (``none`` or empty: no
    tracker); an unknown name is a :class:`ConfigError` naming the allowed ones."""
    return _name_list(value, TRACKER_NAMES, "log.trackers", "a tracker", str.lower)


@dataclass
class LogConfig:
    """Where rank 0 reports a run: experiment trackers (one run per job, continued by --resume)."""

    trackers: str = _f("tensorboard", "comma-separated experiment trackers written by rank 0: tensorboard, "
                       "mlflow, wandb (or none)")
    run_name: str | None = _f(None, "the run's name in the trackers (None: the output directory's name)")
    mlflow_tracking_uri: str | None = _f(None, "MLflow tracking server or store (None: MLFLOW_TRACKING_URI, "
                                         "else MLflow's default)")
    mlflow_experiment: str = _f("hvdtrain", "MLflow experiment the run is created in")
    wandb_project: str = _f("hvdtrain", "Weights & Biases project")
    wandb_entity: str | None = _f(None, "Weights & Biases team or user (None: the account's default)")
    log_checkpoint: str = _f("none", "checkpoint logged to the trackers as an artifact at the end",
                             choices=("none", "best", "final"))

    def check(self) -> None:
        """Every name in ``trackers`` is a known tracker (or the list is ``none``)."""
        tracker_names(self.trackers)


@dataclass
class CommConfig:
    """How gradients travel between workers: Horovod's communication options, for both frameworks.

    Fusion, cycle time, autotune and timeline are read by Horovod at ``hvd.init()``; None/false
    leaves Horovod's default (or what ``horovodrun`` set) in place. Float16 compression is
    ``compression=fp16`` (``train.fp16_allreduce`` is its older spelling) and gradient
    accumulation ``train.grad_accumulation``.
    """

    reduction: str = _f("average", "how gradients are combined across workers: 'average' (allreduce mean) or "
                        "'adasum' (Horovod's Adasum; needs the MPI controller: horovodrun --mpi or mpirun; usually "
                        "with optim.lr_scaling=none)", choices=("average", "adasum"))
    overlap: str = _f("auto", "whether gradient allreduces overlap the backward pass: 'always' (each gradient as soon "
                      "as it exists, Horovod's default), 'never' (all in one fused allreduce after the backward pass), "
                      "'auto' (always, except PyTorch's data parallelism with comm.flat_gradients on CPUs whose cores the "
                      "workers' intra-op threads already fill: there one flat buffer is reduced after the backward "
                      "pass, where an overlapped allreduce only competes with it for the same cores)",
                      choices=("auto", "always", "never"))
    flat_gradients: bool = _f(True, "PyTorch data parallelism without overlap: keep the gradients in one flat buffer "
                              "per dtype, averaged in place by one allreduce per update (no fusion-buffer copies); "
                              "false: Horovod's DistributedOptimizer with one fused allreduce. Overlapped, Adasum, "
                              "compressed and sharded runs keep their own exchange")
    fusion_threshold_mb: float | None = _f(None, "tensor-fusion buffer in MiB (HOROVOD_FUSION_THRESHOLD): small "
                                           "gradients are packed into one allreduce up to this size; 0 turns "
                                           "fusion off; None keeps Horovod's 128", min=0.0, max=4096.0)
    cycle_time_ms: float | None = _f(None, "how often Horovod's background thread batches ready gradients, in ms "
                                     "(HOROVOD_CYCLE_TIME); None keeps Horovod's 1 ms", min=0.0, max=1000.0,
                                     min_exclusive=True)
    autotune: bool = _f(False, "let Horovod tune fusion threshold and cycle time while training (HOROVOD_AUTOTUNE)")
    autotune_log: str | None = _f(None, "CSV file where rank 0 records the values autotune tried "
                                  "(HOROVOD_AUTOTUNE_LOG)")
    timeline: str | None = _f(None, "write Horovod's timeline (Chrome trace JSON; open in chrome://tracing or "
                              "Perfetto) of every collective to this file on rank 0 (HOROVOD_TIMELINE)")
    timeline_mark_cycles: bool = _f(False, "also mark each background-thread cycle in the timeline "
                                    "(HOROVOD_TIMELINE_MARK_CYCLES)")
    # Less communication (hvdtrain.core.compression): gradient compression and local SGD.
    compression: str = _f("none", "gradient compression: 'none', 'fp16' (half-precision allreduce, the same as "
                          "train.fp16_allreduce), 'powersgd' (rank-r low-rank factors with error feedback) or 'topk' "
                          "(largest-magnitude entries with error feedback, exchanged by allgather)",
                          choices=("none", "fp16", "powersgd", "topk"))
    powersgd_rank: int = _f(4, "PowerSGD: rank r of each gradient matrix's approximation (bytes grow with r)",
                            min=1, max=4096)
    powersgd_start_step: int = _f(0, "PowerSGD: optimizer steps allreduced uncompressed before compression starts "
                                  "(warm-up, PyTorch's start_powerSGD_iter)", min=0)
    powersgd_min_size: int = _f(4096, "PowerSGD: gradients with fewer elements (and all vectors) are allreduced "
                                "uncompressed", min=0)
    topk_ratio: float = _f(0.01, "top-k: fraction of each gradient's entries sent (at least one per tensor)",
                           min=0.0, max=1.0, min_exclusive=True)
    local_sgd_steps: int = _f(1, "local SGD: optimizer steps each worker takes alone between averaging the "
                              "parameters (H); 1 is synchronous SGD (gradients allreduced every step)", min=1)
    local_sgd_average_optimizer: bool = _f(False, "local SGD: also average the optimizer state (momentum, Adam "
                                           "moments) at each averaging, in the same fused allreduce")


@dataclass
class ParallelConfig:
    """Model parallelism: pipeline stages across ranks, combined with data parallelism
    (see :mod:`hvdtrain.core.pipeline`); the optimizer state sharded across the data-parallel ranks."""

    pipeline_stages: int = _f(1, "cut the model into this many consecutive stages on neighbouring ranks; the "
                              "world size must divide by it and the world is stages x replicas (1: pure data "
                              "parallelism)", min=1)
    micro_batches: int = _f(1, "micro-batches each worker's batch is split into for the GPipe fill-and-drain "
                            "schedule (idle fraction (S-1)/(M+S-1)); the update equals one step on the whole "
                            "batch", min=1)
    cut: Any = _f("balanced", "where the model's blocks are cut: 'balanced' (equal parameter counts as far as "
                  "possible) or a list of S-1 block boundaries such as [3]")
    shard_optimizer: str = _f("none", "'optimizer' (ZeRO-1): each rank keeps and updates 1/N of the optimizer "
                              "state and the updated parameters are all-gathered, the update equal to data "
                              "parallelism's; 'gradients' (ZeRO-2): also the gradients reduce-scattered, each "
                              "rank keeping only its 1/N after the exchange; checkpoints keep the whole state",
                              choices=("none", "optimizer", "gradients"))

    def check(self) -> None:
        """The cut must be 'balanced' or block boundaries (whether they fit the model is known only
        once the recipe built it)."""
        parse_cut(self.cut)


def parse_cut(cut: Any) -> str | list[int]:
    """``parallel.cut`` as ``"balanced"`` or a list of block boundaries (from a list or ``"3,6"``)."""
    if isinstance(cut, str):
        text = cut.strip()
        if text == "balanced":
            return text
        text = text.strip("[]")
        try:
            return [int(p) for p in text.split(",") if p.strip()]
        except ValueError:
            raise ConfigError(f"parallel.cut: {short(cut)} is not allowed; use 'balanced' or block boundaries "
                              f"such as [3] or '3,6'") from None
    if isinstance(cut, (list, tuple)) and all(isinstance(b, int) and not isinstance(b, bool) for b in cut):
        return list(cut)
    raise ConfigError(f"parallel.cut: {short(cut)} is not allowed; use 'balanced' or block boundaries such as [3]")


@dataclass
class RunConfig:
    """Everything one training run needs; the resolved copy is saved beside the results."""

    recipe: str = _f("image-classification", "recipe name (see `hvdtrain recipes`)")
    framework: str = _f("torch", "deep-learning framework", choices=FRAMEWORKS)
    output: str = _f("runs/latest", "output directory: config.yaml, metrics.jsonl, checkpoints/")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    log: LogConfig = field(default_factory=LogConfig)
    sections: dict[str, Any] = field(default_factory=dict)
    """Recipe-owned sections by name (``image``, ``text``, a user's own): dataclasses declared by the
    recipe (:func:`hvdtrain.define_recipe` ``sections=``), read as ``config.<name>`` and written
    as top-level sections of the config file, exactly like the core's."""

    def __getattr__(self, name: str) -> Any:
        sections = self.__dict__.get("sections") or {}
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or recipe section {name!r}")
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


def resume_keys(config: Any) -> list[tuple[str, str]]:
    """``(dotted key, kind)`` of every field declared with ``resume=`` (:func:`_f`), the core's
    sections first, then the recipe's own (``config.sections``): what ``--resume`` compares."""
    found = []
    sections = [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config) if f.name != "sections"]
    sections += list((getattr(config, "sections", None) or {}).items())
    for name, section in sections:
        if not dataclasses.is_dataclass(section):
            continue
        found += [(f"{name}.{f.name}", f.metadata["resume"]) for f in dataclasses.fields(section)
                  if f.metadata.get("resume")]
    return found



def section_types(config: RunConfig) -> dict[str, type]:
    """The dataclass of each recipe section in ``config``."""
    return {name: type(value) for name, value in config.sections.items()}


def describe_keys(config: RunConfig) -> list[tuple[str, Any, str]]:
    """Every key of ``config`` (core and recipe sections) as ``(dotted key, value, help)``; the help
    ends with the allowed choices or range."""
    rows: list[tuple[str, Any, str]] = []

    def walk(obj: Any, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == "sections" and isinstance(obj, RunConfig):
                for name, section in value.items():
                    walk(section, name + ".")
            elif dataclasses.is_dataclass(value):
                walk(value, prefix + f.name + ".")
            else:
                meta, extra = f.metadata, ""
                if meta.get("choices"):
                    extra = f" [{', '.join(map(str, meta['choices']))}]"
                elif meta.get("min") is not None or meta.get("max") is not None:
                    lo = "" if meta.get("min") is None else f"{'>' if meta.get('min_exclusive') else '>='} {meta['min']}"
                    hi = "" if meta.get("max") is None else f"<= {meta['max']}"
                    extra = f" [{', '.join(p for p in (lo, hi) if p)}]"
                rows.append((prefix + f.name, value, str(meta.get("help", "")) + extra))

    walk(config, "")
    return rows


