"""The torch side of `hvdtrain bench`: an image model from the recipe's
``bench_model`` hook (image-classification's by default) and one
fixed random batch (NCHW), kept on the training device like Horovod's synthetic benchmark."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hvdtrain.core.task import ArrayDataset, TrainTask
from hvdtrain.torch.adapter import build_optimizer

DEFAULT_CLASSES = 1000  # ImageNet, as in Horovod's benchmark


def synthetic_task(config: Any, settings: Any) -> TrainTask:
    """A TrainTask whose train and val data are the same fixed random batch (seeded by train.seed)."""
    from hvdtrain.core.registry import get_hook


    classes = config.model.num_classes or DEFAULT_CLASSES
    size, batch = settings.image_size, config.train.batch_size
    rng = np.random.default_rng(config.train.seed)
    data = ArrayDataset(rng.standard_normal((batch, settings.channels, size, size), dtype=np.float32),
                        rng.integers(0, classes, size=batch, dtype=np.int64))
    torch.manual_seed(config.train.seed)
    model = get_hook(config.recipe, "bench_model")("torch", config.model.name, settings.channels, size, classes)
    return TrainTask(model=model, optimizer=build_optimizer(model.parameters(), config.optim),
                     loss_fn=lambda logits, labels: F.cross_entropy(logits.float(), labels),
                     train_data=data, val_data=data,
                     metric_sums=lambda logits, labels: {"correct": (logits.argmax(dim=1) == labels).sum()})


def to_device(adapter: Any, inputs: np.ndarray, targets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch as tensors on the adapter's device (moved once, not every step)."""
    return torch.from_numpy(inputs).to(adapter.device), torch.from_numpy(targets).to(adapter.device)
