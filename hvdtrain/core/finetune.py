"""Fine-tuning controls, framework-neutral: which epochs train only the classification head, and
how the backbone's learning rate relates to the head's.

``model.freeze_backbone_epochs = N``: in epochs 1..N only the head's parameters are updated; the
backbone (every other trainable parameter) gets no update at all (no weight decay, no momentum
step, its BatchNorm statistics frozen: its normalisation layers run as in evaluation), and from
epoch N+1 everything trains. Whether an epoch is frozen depends only on its index, so a run resumed
at any epoch (or mid-epoch) freezes exactly as an uninterrupted one, on every rank alike.

``optim.backbone_lr_factor = f``: the backbone's learning rate is ``f`` times the head's scheduled
rate (the head always gets the full rate).

The head is what the recipe's :attr:`~hvdtrain.core.task.TrainTask.head` returns (its parameters
or variables); without one, the model's module or layer named one of :data:`HEAD_NAMES` (hvdtrain's
torch ResNets' ``head``, Hugging Face models' ``classifier``, torchvision's ``fc``).
"""

from __future__ import annotations

from typing import Any

from hvdtrain.core.config import ConfigError

HEAD_NAMES = ("classifier", "fc", "head")


def enabled(config: Any) -> bool:
    """Whether the run uses either control (otherwise the adapters leave the optimizer as built)."""
    return config.model.freeze_backbone_epochs > 0 or config.optim.backbone_lr_factor != 1.0


def backbone_frozen(config: Any, epoch: int) -> bool:
    """Whether the backbone is frozen in ``epoch`` (0-based)."""
    return epoch < config.model.freeze_backbone_epochs


def no_head_error(what: str) -> ConfigError:
    """The refusal when neither the recipe nor the model's names say which parameters are the head."""
    return ConfigError(f"model.freeze_backbone_epochs / optim.backbone_lr_factor need the classification head: "
                       f"the recipe's TrainTask.head is not set and {what} has no module or layer named "
                       f"{', '.join(HEAD_NAMES)}")


def check_split(head: int, backbone: int) -> None:
    """Refuse a head that is empty or the whole model (nothing would be a backbone)."""
    if head == 0 or backbone == 0:
        raise ConfigError(f"model.freeze_backbone_epochs / optim.backbone_lr_factor: the head holds {head} and the "
                          f"backbone {backbone} trainable tensors; both must hold some")
