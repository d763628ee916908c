"""What a recipe builder hands the training loop: model, optimizer, loss, data, metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from hvdtrain.core.sources import as_source


class Dataset(Protocol):
    """Random-access data: ``get_batch`` returns framework-neutral NumPy ``(inputs, targets)``.

    ``TrainTask`` also takes a map-style ``torch.utils.data.Dataset`` (``len()`` and integer
    indexing; items ``(inputs, target)`` or mappings with a ``label``/``labels`` column, collated
    like ``default_collate``) and a Hugging Face ``datasets.Dataset``, and reads them through
    :func:`hvdtrain.core.sources.as_source` (``hvdtrain.as_source(data, inputs=..., target=...)``
    chooses the columns); any other kind is refused when the task is built. Every one keeps the same
    order from ``(train.seed, epoch)`` and resumes exactly at any world size."""

    def __len__(self) -> int: ...

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[Any, np.ndarray]: ...


@dataclass
class ArrayDataset:
    """A dataset held in NumPy arrays, with an optional per-batch transform ``(x, y, indices, epoch) -> (x, y)``."""

    inputs: np.ndarray
    targets: np.ndarray
    transform: Callable[[np.ndarray, np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]] | None = None

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.targets):
            raise ValueError(f"inputs ({len(self.inputs)}) and targets ({len(self.targets)}) differ in length")

    def __len__(self) -> int:
        return len(self.targets)

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.inputs[indices], self.targets[indices]
        if self.transform is not None:
            x, y = self.transform(x, y, indices, epoch)
        return x, y


def accuracy_from_sums(sums: dict[str, float]) -> dict[str, float]:
    """Classification accuracy from the summed ``correct`` and ``count``; nothing for a task whose
    ``metric_sums`` has no ``correct`` (a regression reports its loss and its own metrics only)."""
    if "correct" not in sums:
        return {}
    return {"accuracy": sums["correct"] / max(1.0, sums["count"])}


@dataclass
class TrainTask:
    """A recipe's product, consumed by :class:`hvdtrain.core.loop.Trainer` through an adapter.

    ``model``, ``optimizer`` and ``loss_fn`` are framework-native (``loss_fn(outputs, targets)``
    returns a scalar mean loss). ``train_data`` and ``val_data`` are read through
    :func:`hvdtrain.core.sources.as_source` (see :class:`Dataset`): a batch's inputs given as a
    dict are passed as ``model(**inputs)`` in torch and ``model(inputs)`` in Keras, and
    ``loss_fn`` receives what the model returned (a Hugging Face ``ModelOutput`` too: its own
    ``loss`` is there for a ``loss_fn`` that returns it). ``metric_sums(outputs, targets)`` returns framework-native
    per-batch sums (for example ``{"correct": ...}``); ``finalize_metrics`` turns the summed values
    (plus ``count``) into the reported metrics. ``export(output_dir)``, if given, runs on rank 0
    after the last epoch (for example to write a model usable outside hvdtrain).
    ``pipeline_blocks()``, if given, returns ``model`` as an ordered list of framework-native blocks
    whose composition is the model (each block's parameters belong to ``model``); with
    ``parallel.pipeline_stages > 1`` the blocks are cut into consecutive stages. A block is called
    as ``block(x)``, where ``x`` is the model's inputs for the first block and the previous block's
    output after that; a block with ``needs_inputs = True`` is called ``block(x, inputs)`` and also
    gets the micro-batch's model inputs (an attention mask, for example).
    ``head()``, if given, returns the classification head's framework-native parameters (torch) or
    variables (Keras): what ``model.freeze_backbone_epochs`` keeps training and
    ``optim.backbone_lr_factor`` leaves at the full rate (:mod:`hvdtrain.core.finetune`); without it
    the model's module or layer named ``classifier``, ``fc`` or ``head`` is the head.

    **Whose learning rate runs** (:mod:`hvdtrain.core.optimizer_policy`). An ``optimizer`` built
    from ``optim.*`` by ``hvdtrain.torch.build_optimizer`` / ``hvdtrain.tensorflow.build_optimizer``
    gets hvdtrain's schedule (``optim.lr`` scaled by the global batch, warmup, decay). Any other
    optimizer is the task's own and runs as given: its LR, and ``scheduler`` if the task carries
    one (a torch ``LRScheduler`` built on ``optimizer``; a Keras ``LearningRateSchedule``, or a
    Keras optimizer built with one), which the loop steps once after every optimizer update (never
    on the state-creating step at start-up), checkpoints and resumes exactly. ``optim.*`` defaults
    never change it; a contradicting ``optim.name``/``optim.lr`` the user set is refused by name;
    ``optim.schedule=hvdtrain`` asks for hvdtrain's schedule on it. ``config.yaml``, the progress
    line, ``metrics.jsonl`` and the trackers report the LR each update used and the optimizer that ran.
    """

    model: Any
    optimizer: Any
    loss_fn: Callable[[Any, Any], Any]
    train_data: Dataset
    val_data: Dataset
    metric_sums: Callable[[Any, Any], dict[str, Any]]
    finalize_metrics: Callable[[dict[str, float]], dict[str, float]] = accuracy_from_sums
    export: Callable[[Any], None] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    pipeline_blocks: Callable[[], list[Any]] | None = None  # see the class docstring
    head: Callable[[], list[Any]] | None = None  # see the class docstring (fine-tuning controls)
    scheduler: Any = None  # the task's own LR scheduler: see the class docstring

    def __post_init__(self) -> None:
        # data as users have it (hvdtrain.core.sources): a map-style or Hugging Face dataset is read
        # through a wrapper (its .source is the object given); a kind the loop cannot read is refused here
        for name in ("train_data", "val_data"):
            data = getattr(self, name)
            if data is not None:
                setattr(self, name, as_source(data, name))
