"""The image-classification task for PyTorch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import hvdtrain
from hvdtrain.torch import build_optimizer, decay_groups
from recipes.image_classification.common import load_datasets
from recipes.image_classification.torch_models import build_model


def build(config: hvdtrain.RunConfig, ctx: hvdtrain.DistContext) -> hvdtrain.TrainTask:
    """Model, optimizer, loss and data for one worker; the adapter wires up Horovod."""
    train, val, num_classes = load_datasets(config, ctx, channels_first=True)
    torch.manual_seed(config.train.seed)  # identical init everywhere; rank 0's weights are broadcast anyway
    model = build_model(config.model.name, train.channels, train.image_size, num_classes)
    return hvdtrain.TrainTask(
        model=model,
        optimizer=build_optimizer(decay_groups(model, config.optim.weight_decay), config.optim),  # none on BN, bias
        loss_fn=lambda logits, labels: F.cross_entropy(logits.float(), labels),
        train_data=train,
        val_data=val,
        metric_sums=lambda logits, labels: {"correct": (logits.argmax(dim=1) == labels).sum()},
    )
