"""Fine-tuning controls for torch (:mod:`hvdtrain.core.finetune`): the head's parameters, the
backbone's learning-rate factor as optimizer parameter groups, and a frozen backbone.

A frozen backbone's gradients are still computed and exchanged (every rank runs the same
collectives whatever the epoch), then dropped before the optimizer step: parameters without a
gradient are skipped by torch's optimizers entirely (no weight decay, no momentum, no Adam step),
and the backbone's BatchNorm layers run in evaluation mode (their statistics are not updated).
"""

from __future__ import annotations

from typing import Any

import torch

from hvdtrain.core import finetune

LR_FACTOR = "lr_factor"  # a parameter group's learning rate is the scheduled one times this


def head_parameters(task: Any, model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The task's ``head()``, else the parameters of the first module named one of
    :data:`~hvdtrain.core.finetune.HEAD_NAMES`."""
    if task.head is not None:
        return list(task.head())
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in finetune.HEAD_NAMES:
            return list(module.parameters())
    raise finetune.no_head_error(type(model).__name__)


class BackboneControl:
    """Which parameters are the backbone; freezes and releases it."""

    def __init__(self, model: torch.nn.Module, head: list[torch.nn.Parameter]):
        head_ids = {id(p) for p in head}
        self.backbone = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
        finetune.check_split(len(head_ids), len(self.backbone))
        self.backbone_ids = {id(p) for p in self.backbone}
        # normalisation layers whose own parameters are all backbone ones: run as in evaluation while frozen
        self.norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                      and all(id(p) in self.backbone_ids for p in m.parameters(recurse=False))]
        self.frozen = False

    def split_groups(self, optimizer: torch.optim.Optimizer, factor: float) -> torch.optim.Optimizer:
        """The same optimizer (class and settings) with each parameter group split into its head part
        (``lr_factor`` 1) and its backbone part (``lr_factor`` ``factor``); empty parts are dropped.
        Called before any step, so there is no state to carry."""
        groups = []
        for group in optimizer.param_groups:
            settings = {k: v for k, v in group.items() if k != "params"}
            for part, f in ((lambda p: id(p) not in self.backbone_ids, 1.0), (lambda p: id(p) in self.backbone_ids,
                                                                              factor)):
                params = [p for p in group["params"] if part(p)]
                if params:
                    groups.append({**settings, "params": params, LR_FACTOR: f})
        return type(optimizer)(groups, **optimizer.defaults)

    def after_train_mode(self) -> None:
        """After ``model.train()``: a frozen backbone's BatchNorm layers back to evaluation mode."""
        if self.frozen:
            for module in self.norms:
                module.eval()

    def drop_frozen_grads(self) -> None:
        """A frozen backbone's gradients removed (after the exchange, before clipping and the step)."""
        if self.frozen:
            for p in self.backbone:
                p.grad = None

    def is_frozen(self, p: torch.nn.Parameter) -> bool:
        """Whether ``p`` receives no update in this epoch."""
        return self.frozen and id(p) in self.backbone_ids
