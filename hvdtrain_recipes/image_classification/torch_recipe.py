"""The image-classification task for PyTorch."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

import hvdtrain
from hvdtrain.data.normalize import GRAY_MEAN, GRAY_STD, RGB_MEAN, RGB_STD
from hvdtrain.torch import build_optimizer, decay_groups
from hvdtrain.torch.images import normalize_inputs
from hvdtrain_recipes.image_classification import export, hf_models
from hvdtrain_recipes.image_classification.common import class_labels, hf_model, load_image_data, model_name
from hvdtrain_recipes.image_classification.torch_models import build_model, pipeline_blocks


def own_model(config, train, num_classes: int, main: bool = True) -> torch.nn.Module:
    """One of the recipe's models; with ``model.pretrained``, torchvision-layout ResNet weights
    loaded into it (hvdtrain_recipes/image_classification/torchvision_weights.py); ``main`` (rank 0) prints
    what the load noted, such as a head re-initialised for the dataset's classes."""
    model = build_model(model_name(config, train), train.channels, train.image_size, num_classes)
    if config.model.pretrained:
        from hvdtrain_recipes.image_classification.torchvision_weights import load_torchvision_resnet

        for note in load_torchvision_resnet(model, config.model.pretrained, "torch"):
            if main:
                print(f"hvdtrain: {note}", flush=True)
    return model


def build(config: hvdtrain.RunConfig, ctx: hvdtrain.DistContext) -> hvdtrain.TrainTask:
    """Model, optimizer, loss and data for one worker; the adapter wires up Horovod. Batches
    arrive as uint8 NHWC; the model's input hook (or the Hugging Face wrapper) normalises them on
    its device."""
    export.check_target(config.output, config.model.name)  # never replace a user's folder
    hf = hf_model(config)
    train, val, num_classes = load_image_data(config, ctx)
    labels = class_labels(train, num_classes)
    if hf is not None:
        hf_models.check_input_size(hf, train.policy.size, "torch")
    torch.manual_seed(config.train.seed)  # identical init everywhere; rank 0's weights are broadcast anyway
    if hf is not None:
        from hvdtrain_recipes.image_classification import hf_torch

        model = hf_torch.load_model(hf, labels, config.train.seed)
        blocks, head = None, lambda: list(model.model.classifier.parameters())  # noqa: E731  (fine-tuning controls)
        mean, std = hf.preprocessing.mean, hf.preprocessing.std
    else:
        inner = own_model(config, train, num_classes, main=ctx.is_main)
        model = normalize_inputs(inner)
        blocks = lambda: stage_blocks(model)  # noqa: E731  (parallel.pipeline_stages > 1)
        head = None  # the module named head (hvdtrain's ResNets) or classifier
        mean, std = (GRAY_MEAN, GRAY_STD) if train.channels == 1 else (RGB_MEAN, RGB_STD)
    record = export.make_record(labels=labels, framework="torch", source="huggingface" if hf else "hvdtrain",
                                model=hf.model_type if hf else model_name(config, train), policy=train.policy,
                                channels=train.channels, grayscale=train.channels == 1, mean=mean, std=std)

    def write_model(folder: Path) -> None:
        if hf is not None:
            model.model.save_pretrained(folder)
        else:
            from safetensors.torch import save_file

            save_file({k: v.detach().cpu().contiguous() for k, v in inner.state_dict().items()},
                      str(folder / export.TORCH_FILE))

    return hvdtrain.TrainTask(
        model=model,
        optimizer=build_optimizer(decay_groups(model, config.optim.weight_decay), config.optim),  # none on BN, bias
        loss_fn=lambda logits, labels: F.cross_entropy(logits.float(), labels),
        train_data=train,
        val_data=val,
        metric_sums=lambda logits, labels: {"correct": (logits.argmax(dim=1) == labels).sum()},
        export=(lambda output: export.write_export(output, write_model, record))
        if config.parallel.pipeline_stages <= 1 else None,
        info={"labels": labels},
        pipeline_blocks=blocks,
        head=head,
    )


def stage_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``model``'s pipeline blocks; the first one takes the uint8 NHWC batch itself, since a pipeline
    stage calls its blocks directly and the whole model's input hook does not run."""
    blocks = pipeline_blocks(model)
    normalize_inputs(blocks[0])  # float inputs pass through the hook unchanged
    return blocks
