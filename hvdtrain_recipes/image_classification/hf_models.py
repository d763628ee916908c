"""Hugging Face image-classification directories as ``--model`` of the image-classification recipe
(framework-free: no torch, no TensorFlow here).

A directory as ``save_pretrained`` writes it (``config.json`` and ``model.safetensors`` or
``pytorch_model.bin``, optionally ``preprocessor_config.json``) is loaded in torch by
``transformers.AutoModelForImageClassification`` (:mod:`hvdtrain_recipes.image_classification.hf_torch`)
and in TensorFlow by keras-hub where keras-hub converts the architecture
(:mod:`hvdtrain_recipes.image_classification.hf_keras`: ViT, DeiT, Swin, DINOv2). Both start from the same
weights and the same fresh classification head, drawn here with NumPy from ``train.seed`` and
sized to the dataset's classes, so they compute the same logits.

The checkpoint's preprocessing (input size, resize or resize-and-centre-crop, ``image_mean`` /
``image_std``) replaces the recipe's image defaults unless the user set ``image.size`` or
``image.transform``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvdtrain_recipes.model_files import check_no_remote_code

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
PREPROCESSOR_FILE = "preprocessor_config.json"
HEAD_NAME = "classifier"  # the head's layer/parameter name in both frameworks
# keras-hub converts these Hugging Face model types; the value is how the classifier pools the
# backbone's token sequence: "cls" (first token), "mean" (all tokens), "cls+mean" (the first
# token next to the mean of the patch tokens, as Dinov2ForImageClassification does)
KERAS_HUB_POOLING = {"vit": "cls", "deit": "cls", "swin": "mean", "dinov2": "cls+mean",
                     "dinov2_with_registers": "cls+mean"}


class HFModelError(ValueError):
    """The Hugging Face model directory cannot be used; the message names the file, key or architecture."""


@dataclass(frozen=True)
class Preprocessing:
    """What the checkpoint expects: square input ``size``, whether it centre-crops (``crop``: the
    fraction of the shorter side kept) or squashes the image (``crop`` None), and the channel mean
    and std of ``(x / 255 - mean) / std``."""

    size: int
    crop: float | None
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass(frozen=True)
class HFImageModel:
    """A resolved Hugging Face image model directory."""

    path: Path
    config: dict
    preprocessing: Preprocessing

    @property
    def model_type(self) -> str:
        """``config.json``'s ``model_type`` (vit, deit, swin, convnext, resnet, ...)."""
        return str(self.config.get("model_type"))

    @property
    def channels(self) -> int:
        """Input channels the model takes."""
        return int(self.config.get("num_channels", 3))


def is_hf_model(name: str | None) -> bool:
    """True if ``model.name`` names a directory (the recipe's own models are plain names)."""
    return bool(name) and Path(name).expanduser().is_dir()


def _side(value, default: int) -> int:
    """A size entry of a preprocessor config (an int or a dict of height/width/shortest_edge)."""
    if isinstance(value, dict):
        for key in ("shortest_edge", "height", "width"):
            if key in value:
                return int(value[key])
        return default
    return int(value) if value is not None else default


def read_preprocessing(path: Path, config: dict) -> Preprocessing:
    """The checkpoint's preprocessing from ``preprocessor_config.json`` (ViT-style squash to
    ``size``; ConvNeXt-style ``crop_pct`` or DeiT-style ``crop_size`` give a centre crop); without
    that file: ``config.json``'s ``image_size``, squash, ImageNet mean and std."""
    image_size = config.get("image_size", 224)
    image_size = image_size[0] if isinstance(image_size, (list, tuple)) else int(image_size)
    file = path / PREPROCESSOR_FILE
    if not file.is_file():
        return Preprocessing(image_size, None, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    try:
        pre = json.loads(file.read_text())
    except ValueError as exc:
        raise HFModelError(f"{file} is not valid JSON ({exc})") from None
    mean = tuple(float(v) for v in pre.get("image_mean", (0.485, 0.456, 0.406)))
    std = tuple(float(v) for v in pre.get("image_std", (0.229, 0.224, 0.225)))
    if pre.get("do_normalize") is False:
        mean, std = (0.0,) * len(mean), (1.0,) * len(std)
    resized = _side(pre.get("size"), image_size)
    if pre.get("crop_pct") is not None and resized < 384:  # ConvNeXt/ResNet: resize to size/crop_pct, crop size
        return Preprocessing(resized, float(pre["crop_pct"]), mean, std)
    if pre.get("do_center_crop") and pre.get("crop_size") is not None:  # DeiT: resize 256, crop 224
        crop = _side(pre["crop_size"], resized)
        return Preprocessing(crop, crop / resized if resized > crop else None, mean, std)
    return Preprocessing(resized, None, mean, std)


def resolve(name: str) -> HFImageModel:
    """The directory ``name`` as a Hugging Face image model; HFModelError naming the missing file."""
    path = Path(name).expanduser()
    if not path.is_dir():
        raise HFModelError(f"model directory {name} does not exist")
    if not (path / "config.json").is_file():
        raise HFModelError(f"model directory {path} has no config.json; expected a Hugging Face image model "
                           f"directory (config.json and {' or '.join(WEIGHT_FILES[::2])}, as save_pretrained "
                           f"writes it) or one of the recipe's models")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise HFModelError(f"model directory {path} has no weights; expected one of: {', '.join(WEIGHT_FILES)}")
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError as exc:
        raise HFModelError(f"{path / 'config.json'} is not valid JSON ({exc})") from None
    if "model_type" not in config:
        raise HFModelError(f"{path / 'config.json'} has no model_type; it is not a Hugging Face model config")
    check_no_remote_code(path)  # both frameworks, before the data is read
    return HFImageModel(path, config, read_preprocessing(path, config))


def apply_preprocessing(image, hf: HFImageModel):
    """The recipe's ``image`` section with the checkpoint's size and resize/crop where the user left
    the defaults (``image.size`` None, ``image.transform`` auto): a centre-cropping checkpoint
    trains with ``imagenet`` (RandomResizedCrop; val: resize + centre crop), a squashing one with
    ``pad-crop`` (val: squash to the size, as the checkpoint's processor does)."""
    changes = {}
    if image.size is None:
        changes["size"] = hf.preprocessing.size
    if image.transform == "auto":
        changes["transform"] = "imagenet" if hf.preprocessing.crop else "pad-crop"
    return dataclasses.replace(image, **changes) if changes else image


def check_keras_supported(hf: HFImageModel) -> str:
    """The pooling of a keras-hub-converted architecture, or HFModelError naming the supported ones."""
    pooling = KERAS_HUB_POOLING.get(hf.model_type)
    if pooling is None:
        raise HFModelError(f"the TensorFlow version cannot load {hf.path}: keras-hub converts no "
                           f"{hf.model_type!r} image model from a Hugging Face checkpoint (supported: "
                           f"{', '.join(KERAS_HUB_POOLING)}); use --framework torch for this model")
    return pooling


def check_input_size(hf: HFImageModel, size: int, framework: str) -> None:
    """Vision transformers take the size their position embeddings were trained for (torch: ViT and
    DeiT; TensorFlow: every keras-hub backbone); HFModelError names the sizes otherwise."""
    fixed = set(KERAS_HUB_POOLING) if framework == "tensorflow" else {"vit", "deit"}
    expected = hf.config.get("image_size")
    if hf.model_type in fixed and expected is not None and int(expected) != size:
        raise HFModelError(f"image.size={size} but the {hf.model_type} model in {hf.path} takes {expected}x{expected} "
                           f"images (config.json image_size); use --set image.size={expected} or leave it unset")


def head_weights(in_features: int, num_labels: int, seed: int, std: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """The classification head's initial kernel ``(in_features, num_labels)`` and zero bias, from ``seed`` alone."""
    kernel = np.random.default_rng([seed, 4242]).normal(0.0, std, size=(in_features, num_labels))
    return kernel.astype(np.float32), np.zeros(num_labels, dtype=np.float32)


def label_maps(labels: list[str]) -> dict:
    """``id2label`` and ``label2id`` for the dataset's class names."""
    return {"id2label": dict(enumerate(labels)), "label2id": {name: i for i, name in enumerate(labels)}}
