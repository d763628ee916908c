"""Learning-rate schedule: base LR scaled by the global batch, linear warmup, then a decay.

Following Goyal et al. (2017) and Horovod's examples, the peak LR is the base LR scaled by how
many local batches one optimizer update averages: workers times gradient-accumulation steps
(``linear``: ``lr * n``, ``sqrt``: ``lr * sqrt(n)``, ``none``). ``auto`` (the default) is
``linear`` for SGD and ``sqrt`` for Adam/AdamW, whose updates are normalised by the gradient's
second moment (Malladi et al., 2022: the square-root rule for adaptive optimizers). Warmup ramps
linearly from the unscaled base LR to that peak, then the LR decays (cosine, linear or constant)
to ``min_lr_ratio * peak`` at the last step.

Training progress is measured in the data, not in optimizer steps: a position is (completed
epochs, samples of the current epoch's order consumed), which means the same thing for any
number of workers. :func:`schedule_step` turns a position into the schedule's step units at the
current world size, so after a resume or an elastic re-form on another number of workers the LR
is the schedule's value for the samples already seen, with the peak scaled for the new global
batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


SCALING_RULES = ("auto", "linear", "sqrt", "none")


def resolve_scaling(rule: str, optimizer: str) -> str:
    """The concrete rule ``auto`` stands for: ``linear`` for SGD, ``sqrt`` for Adam and AdamW."""
    if rule != "auto":
        return rule
    return "linear" if optimizer == "sgd" else "sqrt"


def scale_lr(base_lr: float, world_size: int, rule: str) -> float:
    """The peak LR when one update averages ``world_size`` local batches (workers times
    accumulation steps) under scaling ``rule`` (a concrete one: see :func:`resolve_scaling`)."""
    if rule == "linear":
        return base_lr * world_size
    if rule == "sqrt":
        return base_lr * math.sqrt(world_size)
    if rule == "none":
        return base_lr
    raise ValueError(f"lr scaling rule {rule!r} is not allowed; choose one of: {', '.join(SCALING_RULES)}")


@dataclass(frozen=True)
class LRSchedule:
    """LR as a function of the optimizer step (0-based, may be fractional: see
    :func:`schedule_step`); pure Python, the same on every rank."""

    base_lr: float
    peak_lr: float
    warmup_steps: int
    total_steps: int
    decay: str = "cosine"
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.base_lr + (self.peak_lr - self.base_lr) * (step + 1) / self.warmup_steps
        floor = self.peak_lr * self.min_lr_ratio
        span = max(1, self.total_steps - self.warmup_steps - 1)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.decay == "constant":
            return self.peak_lr
        if self.decay == "linear":
            return floor + (self.peak_lr - floor) * (1.0 - progress)
        if self.decay == "cosine":
            return floor + (self.peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        raise ValueError(f"decay {self.decay!r} is not allowed; choose one of: cosine, linear, constant")


def build_schedule(optim, world_size: int, steps_per_epoch: int, epochs: int,
                   grad_accumulation: int = 1, max_steps: int | None = None) -> LRSchedule:
    """The schedule an :class:`~hvdtrain.core.config.OptimConfig` describes, in optimizer steps of
    ``world_size`` workers each accumulating ``grad_accumulation`` micro-batches per update, over
    ``epochs`` epochs or ``max_steps`` updates (``train.max_steps``), whichever is fewer."""
    return LRSchedule(
        base_lr=optim.lr,
        peak_lr=scale_lr(optim.lr, world_size * grad_accumulation, resolve_scaling(optim.lr_scaling, optim.name)),
        warmup_steps=int(round(optim.warmup_epochs * steps_per_epoch)),
        total_steps=max(1, min(steps_per_epoch * epochs, max_steps or steps_per_epoch * epochs)),
        decay=optim.decay,
        min_lr_ratio=optim.min_lr_ratio,
    )


def schedule_step(epoch: int, consumed: int, samples_per_step: int, steps_per_epoch: int) -> float:
    """The schedule's step for a position in the data: ``epoch`` completed epochs plus ``consumed``
    samples of the current epoch's order, with ``samples_per_step`` samples per optimizer update
    (batch size x workers x accumulation) and ``steps_per_epoch`` updates per epoch at this world
    size. Without a world-size change this is exactly the number of updates taken so far; after
    one it is the fraction of training done, in this world size's units."""
    return epoch * steps_per_epoch + min(consumed / samples_per_step, float(steps_per_epoch))
