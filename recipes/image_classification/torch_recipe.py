"""The image-classification task for PyTorch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import hvdtrain
from hvdtrain.torch import build_optimizer, decay_groups
from hvdtrain.torch.images import normalize_inputs
from recipes.image_classification.common import load_image_data, model_name
from recipes.image_classification.torch_models import build_model, pipeline_blocks


def build(config: hvdtrain.RunConfig, ctx: hvdtrain.DistContext) -> hvdtrain.TrainTask:
    """Model, optimizer, loss and data for one worker; the adapter wires up Horovod. Batches
    arrive as uint8 NHWC; the model's input hook normalises them on its device."""
    train, val, num_classes = load_image_data(config, ctx)
    torch.manual_seed(config.train.seed)  # identical init everywhere; rank 0's weights are broadcast anyway
    model = normalize_inputs(build_model(model_name(config, train), train.channels, train.image_size, num_classes))
    return hvdtrain.TrainTask(
        model=model,
        optimizer=build_optimizer(decay_groups(model, config.optim.weight_decay), config.optim),  # none on BN, bias
        loss_fn=lambda logits, labels: F.cross_entropy(logits.float(), labels),
        train_data=train,
        val_data=val,
        metric_sums=lambda logits, labels: {"correct": (logits.argmax(dim=1) == labels).sum()},
        pipeline_blocks=lambda: stage_blocks(model),  # parallel.pipeline_stages > 1
    )


def stage_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``model``'s pipeline blocks; the first one takes the uint8 NHWC batch itself, since a pipeline
    stage calls its blocks directly and the whole model's input hook does not run."""
    blocks = pipeline_blocks(model)
    normalize_inputs(blocks[0])  # float inputs pass through the hook unchanged
    return blocks
