"""Tiny Hugging Face image classifiers and image trees for the image tests: configs the tests write,
random weights, saved with ``save_pretrained`` (safetensors) the way Hugging Face saves them, and a
``preprocessor_config.json`` like the hub's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

TINY = {  # model_type -> (config class, model class, config kwargs)
    "vit": ("ViTConfig", "ViTForImageClassification",
            dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64)),
    "deit": ("DeiTConfig", "DeiTForImageClassification",
             dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64)),
    "swin": ("SwinConfig", "SwinForImageClassification",
             dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)),
    "dinov2": ("Dinov2Config", "Dinov2ForImageClassification",
               dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    mlp_ratio=2)),
    "resnet": ("ResNetConfig", "ResNetForImageClassification",
               dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")),
    "convnext": ("ConvNextConfig", "ConvNextForImageClassification",
                 dict(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)),
}
# the hub's processors: ViT-style squash with mean/std 0.5, ConvNeXt-style resize + centre crop (crop_pct)
SQUASH = {"do_resize": True, "size": {"height": 32, "width": 32}, "do_normalize": True,
          "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "image_processor_type": "ViTImageProcessor"}
CROP = {"do_resize": True, "size": {"shortest_edge": 32}, "crop_pct": 0.875, "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
        "image_processor_type": "ConvNextImageProcessor"}


def save_tiny_model(folder: Path, model_type: str, num_labels: int = 5, seed: int = 0) -> Path:
    """A randomly initialised tiny ``model_type`` classifier saved to ``folder`` (its own head of
    ``num_labels`` classes, which fine-tuning replaces)."""
    import torch
    import transformers

    config_cls, model_cls, kwargs = TINY[model_type]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(num_labels=num_labels, **kwargs)
    model = getattr(transformers, model_cls)(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    cnn = model_type in ("resnet", "convnext")
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(CROP if cnn else SQUASH, indent=1))
    return Path(folder)


def color_tree(root: Path, classes=("red", "green", "blue"), per_class=16, val_per_class=6, size=(40, 36)) -> Path:
    """An ImageFolder tree of small RGB PNGs whose dominant colour is the class (learnable)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", val_per_class)):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 90, (size[1], size[0], 3))
                pixels[:, :, c % 3] += 140
                Image.fromarray(pixels.astype(np.uint8), mode="RGB").save(root / split / name / f"{i:03d}.png")
    return root
