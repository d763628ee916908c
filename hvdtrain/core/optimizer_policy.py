"""Whose learning rate runs: hvdtrain's schedule, or the optimizer and scheduler the task brought.

hvdtrain's schedule (:mod:`hvdtrain.core.schedule`: ``optim.lr`` scaled by the global batch,
warmup, decay) sets the LR of optimizers built from ``optim.*`` (``hvdtrain.torch.build_optimizer``,
``hvdtrain.tensorflow.build_optimizer``, which mark what they build) and of any optimizer when
``optim.schedule=hvdtrain`` asks for it. Any other optimizer is the task's own: its LR, and the
scheduler the task carries (``TrainTask.scheduler``: a torch ``LRScheduler``; a Keras
``LearningRateSchedule``, or an optimizer built with one), run as given; the loop steps the
scheduler once per real update and the adapter checkpoints it.

``optim.*`` defaults never touch the task's own optimizer. A key the user set (in the recipe's
defaults, a config file or an override) that contradicts it is refused in one line naming the key
(``optim.name`` another class, ``optim.lr`` another LR); one that does not apply to it
(``optim.momentum``, ``optim.warmup_epochs``, ...) is named in one warning line. What ran is what is
reported: :func:`ran_config` is the config as ``config.yaml`` and the trackers record it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from hvdtrain.core.config import ConfigError, OptimConfig, to_dict
from hvdtrain.core.provenance import user_set

# an optimizer built from optim.* carries this attribute (True): hvdtrain's schedule sets its LR
FROM_CONFIG = "_hvdtrain_from_optim_config"
SCHEDULES = ("auto", "hvdtrain", "task")
# optim.* keys of hvdtrain's schedule (a warning names those the user set when the task's own LR runs),
# and of the optimizer build_optimizer makes (a recipe may read them to build its own)
SCHEDULE_KEYS = ("lr_scaling", "warmup_epochs", "decay", "min_lr_ratio")
NOT_APPLIED = ("momentum", "weight_decay", *SCHEDULE_KEYS)


def mark_from_config(optimizer: Any) -> Any:
    """Mark ``optimizer`` as built from ``optim.*`` (the ``build_optimizer`` functions); returns it."""
    setattr(optimizer, FROM_CONFIG, True)
    return optimizer


@dataclass(frozen=True)
class OptimizerFacts:
    """What an adapter reads from the task's optimizer and scheduler before it prepares them."""

    name: str  # the optimizer's class, qualified: "torch.optim.adamw.AdamW"
    lr: float | None  # the LR of its next update (the first parameter group's)
    base_lr: float | None  # the LR it was built with (a schedule's initial LR); None: not known
    from_config: bool  # built by build_optimizer from optim.*
    scheduler: str | None = None  # the task's scheduler (or the optimizer's own LR schedule), qualified

    @property
    def short(self) -> str:
        """The optimizer's class name alone (``AdamW``)."""
        return self.name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class LRPolicy:
    """The decision: ``hvdtrain`` (hvdtrain's schedule sets the LR before each update) or ``task``
    (the task's optimizer and scheduler run as given; the LR is read back from the optimizer)."""

    mode: str
    facts: OptimizerFacts | None = None
    optim: OptimConfig | None = None  # hvdtrain mode: the OptimConfig whose schedule runs

    @property
    def task(self) -> bool:
        """The task's own LR runs (hvdtrain's schedule is off)."""
        return self.mode == "task"

    def describe(self) -> str:
        """One phrase for the start line: whose LR runs."""
        if not self.task or self.facts is None:
            return ""
        what = f"the task's optimizer {self.facts.short}"
        if self.facts.scheduler:
            what += f" with its scheduler {self.facts.scheduler.rsplit('.', 1)[-1]}"
        return f"LR from {what} (hvdtrain's schedule off)"


def explicit_keys(config: Any) -> set[str]:
    """The dotted ``optim.*`` keys the user set (:func:`hvdtrain.core.provenance.user_set`)."""
    return {f"optim.{f.name}" for f in dataclasses.fields(OptimConfig) if user_set(config, f"optim.{f.name}")}


def _same_lr(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)


def decide(config: Any, facts: OptimizerFacts | None, has_scheduler: bool = False) -> tuple[LRPolicy, list[str]]:
    """Whose LR runs for ``config`` and the task's optimizer ``facts`` (None: an adapter that does
    not describe its optimizer, which keeps hvdtrain's schedule), and the warning lines to print on
    rank 0. Raises :class:`~hvdtrain.core.config.ConfigError` naming the key for a contradiction."""
    optim = config.optim
    choice = getattr(optim, "schedule", "auto")
    if facts is None:
        return LRPolicy("hvdtrain", None, optim), []
    scheduled = has_scheduler or facts.scheduler is not None
    if choice == "hvdtrain" and scheduled:
        raise ConfigError(f"optim.schedule=hvdtrain: the task brings its own LR schedule ({facts.scheduler}); "
                          f"drop optim.schedule (the task's schedule runs) or the task's scheduler")
    if facts.from_config and not scheduled:
        mode = "task" if choice == "task" else "hvdtrain"
        return LRPolicy(mode, facts, optim if mode == "hvdtrain" else None), []
    if facts.from_config:  # built from optim.* but with the task's own scheduler: the scheduler runs
        return LRPolicy("task", facts), []
    explicit = explicit_keys(config)
    if "optim.name" in explicit and facts.short.lower() != optim.name:
        raise ConfigError(f"optim.name={optim.name} contradicts the task's optimizer {facts.name}, which the recipe "
                          f"built itself (hvdtrain uses it as given); drop optim.name, or build the optimizer from "
                          f"optim.* with build_optimizer")
    if "optim.lr" in explicit and facts.base_lr is not None and not _same_lr(facts.base_lr, optim.lr):
        raise ConfigError(f"optim.lr={optim.lr:g} contradicts the task's optimizer {facts.short} (built with lr "
                          f"{facts.base_lr:g}), which hvdtrain uses as given; drop optim.lr or build the optimizer "
                          f"with that LR")
    if choice == "hvdtrain":  # asked for: hvdtrain's schedule with the optimizer's own LR as its base
        kind = facts.short.lower()
        name = kind if kind in ("sgd", "adam", "adamw") else "adam"
        if optim.lr_scaling == "auto" and kind not in ("sgd", "adam", "adamw"):
            raise ConfigError(f"optim.schedule=hvdtrain with optim.lr_scaling=auto: hvdtrain cannot tell how "
                              f"{facts.short}'s LR grows with the batch; set optim.lr_scaling to linear, sqrt or none")
        if facts.lr is None:
            raise ConfigError(f"optim.schedule=hvdtrain: the task's optimizer {facts.short} has no plain LR to "
                              f"scale; drop optim.schedule")
        return LRPolicy("hvdtrain", facts, dataclasses.replace(optim, name=name, lr=facts.base_lr or facts.lr)), []
    ignored = [k for k in SCHEDULE_KEYS if f"optim.{k}" in explicit]
    if "optim.lr" in explicit and facts.base_lr is None:
        ignored.insert(0, "lr")
    warnings = []
    if ignored:
        keys = ", ".join(f"optim.{k}={getattr(optim, k)}" for k in ignored)
        warnings.append(f"hvdtrain: {keys} not applied: the task's optimizer {facts.short} runs as the recipe built "
                        f"it{' with its scheduler' if scheduled else ''} (optim.schedule=hvdtrain applies hvdtrain's "
                        f"schedule to it)")
    return LRPolicy("task", facts), warnings


def check_task_schedule(config: Any, policy: LRPolicy, has_scheduler: bool) -> None:
    """Refuse, naming the key, what a task's own scheduler cannot run with."""
    if not has_scheduler:
        return
    if config.train.elastic:
        raise ConfigError("train.elastic=true: the task's LR scheduler is not part of elastic commits yet; "
                          "use train.elastic=false or drop TrainTask.scheduler")
    if config.parallel.pipeline_stages > 1:
        raise ConfigError(f"parallel.pipeline_stages={config.parallel.pipeline_stages}: the task's LR scheduler "
                          f"does not reach the stages' optimizers; use parallel.pipeline_stages=1 or drop "
                          f"TrainTask.scheduler")
    if config.optim.backbone_lr_factor != 1.0:
        raise ConfigError(f"optim.backbone_lr_factor={config.optim.backbone_lr_factor:g}: splitting the parameter "
                          f"groups makes a new optimizer the task's scheduler does not drive; use "
                          f"optim.backbone_lr_factor=1 or drop TrainTask.scheduler")


def ran_config(config: Any, policy: LRPolicy | None) -> dict[str, Any]:
    """The config as it ran, as a plain dict (``config.yaml``, the trackers' parameters): with the
    task's own optimizer, the ``optim`` section names it (``optim.ran``) and its LR at the start,
    and leaves out the ``optim.*`` keys that did not apply (a resume compares only what is there)."""
    data = to_dict(config)
    if policy is None or policy.facts is None or policy.facts.from_config and not policy.task:
        return data
    facts, section = policy.facts, dict(data["optim"])
    if policy.task:
        ran = facts.name + (f" + {facts.scheduler}" if facts.scheduler else "")
        section = {k: v for k, v in section.items() if k not in ("name", *NOT_APPLIED)}
        section["lr"] = facts.lr
    else:  # hvdtrain's schedule on the task's optimizer: its base LR is the optimizer's
        ran = facts.name
        section["lr"] = policy.optim.lr
    section["schedule"] = policy.mode
    section["ran"] = ran
    data["optim"] = section
    return data
