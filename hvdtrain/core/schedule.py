"""Learning-rate schedule: base LR scaled by world size, linear warmup, then a decay.

Following Goyal et al. (2017) and Horovod's advice, the peak LR is the base LR scaled by the
number of workers (``linear``: ``lr * size``, ``sqrt``: ``lr * sqrt(size)``, ``none``); warmup
ramps linearly from the unscaled base LR to that peak, then the LR decays (cosine, linear or
constant) to ``min_lr_ratio * peak`` at the last step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def scale_lr(base_lr: float, world_size: int, rule: str) -> float:
    """The peak LR for ``world_size`` workers under scaling ``rule``."""
    if rule == "linear":
        return base_lr * world_size
    if rule == "sqrt":
        return base_lr * math.sqrt(world_size)
    if rule == "none":
        return base_lr
    raise ValueError(f"lr scaling rule {rule!r} is not allowed; choose one of: linear, sqrt, none")


@dataclass(frozen=True)
class LRSchedule:
    """LR as a function of the optimizer step (0-based); pure Python, the same on every rank."""

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


def build_schedule(optim, world_size: int, steps_per_epoch: int, epochs: int) -> LRSchedule:
    """The schedule an :class:`~hvdtrain.core.config.OptimConfig` describes, in optimizer steps."""
    return LRSchedule(
        base_lr=optim.lr,
        peak_lr=scale_lr(optim.lr, world_size, optim.lr_scaling),
        warmup_steps=int(round(optim.warmup_epochs * steps_per_epoch)),
        total_steps=max(1, steps_per_epoch * epochs),
        decay=optim.decay,
        min_lr_ratio=optim.min_lr_ratio,
    )
