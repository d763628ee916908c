"""Data set-up shared by the torch and TensorFlow builders of the image-classification recipe: one
call to :func:`hvdtrain.data.open_images`; what is the recipe's own is the embedded MNIST default,
a Hugging Face model's preprocessing (its size and resize/crop unless set) and the model's class count."""

from __future__ import annotations

from hvdtrain.data import ImageOptions, open_images
from hvdtrain.data.mnist import embedded_mnist
from hvdtrain_recipes.image_classification.hf_models import HFImageModel, apply_preprocessing, is_hf_model, resolve

LARGE_IMAGE_MODEL = "resnet50"


def image_section(config) -> ImageOptions:
    """The run's ``image`` section (its defaults for a recipe that does not declare it)."""
    return config.sections.get("image") or ImageOptions()


def hf_model(config) -> HFImageModel | None:
    """The Hugging Face model directory ``model.name`` names, or None for the recipe's own models."""
    if not is_hf_model(config.model.name):
        return None
    if config.model.pretrained:
        raise ValueError(f"model.pretrained={config.model.pretrained} loads torchvision ResNet weights into the "
                         f"recipe's own ResNets; --model {config.model.name} is a Hugging Face directory with its "
                         f"own weights: leave model.pretrained unset")
    return resolve(config.model.name)


def class_labels(train, num_classes: int) -> list[str]:
    """The class folder names in label order (``model.num_classes`` beyond them: ``unused_<k>``)."""
    names = list(train.index.classes)
    return names + [f"unused_{k}" for k in range(len(names), num_classes)]


def load_image_data(config, ctx):
    """uint8 NHWC train and val datasets from ``--data`` or the embedded MNIST, and the number of classes."""
    image = image_section(config)
    hf = hf_model(config)
    if hf is not None:  # the checkpoint's size and resize/crop, unless the user set them
        image = apply_preprocessing(image, hf)
    root = config.data.path or (None if image.train_shards else embedded_mnist())
    data = open_images(root, image, seed=config.train.seed, max_train=config.data.max_train_samples,
                       max_val=config.data.max_val_samples, shuffle=config.data.shuffle, world_size=ctx.data_size,
                       local_size=ctx.local_size, elastic=config.train.elastic)
    num_classes = config.model.num_classes or len(data.classes)
    if num_classes < len(data.classes):
        raise ValueError(f"model.num_classes={num_classes} is smaller than the {len(data.classes)} class "
                         f"folders found in {root}")
    if ctx.is_main and hf is not None:
        pre = hf.preprocessing
        print(f"hvdtrain: model: Hugging Face {hf.model_type} from {hf.path}; its preprocessing: {pre.size}x{pre.size}, "
              f"{f'resize + centre crop {pre.crop:g}' if pre.crop else 'resize'}, mean {list(pre.mean)} std "
              f"{list(pre.std)} (unless image.size or image.transform is set); a new {num_classes}-class head",
              flush=True)
    if ctx.is_main:
        print(f"hvdtrain: images: {data.describe()}", flush=True)
    return data.train, data.val, num_classes


def model_name(config, train) -> str:
    """``model.name``, with ``auto`` resolved: small_cnn up to 64 pixels, else ResNet-50."""
    name = config.model.name
    if name == "auto":
        return "small_cnn" if train.policy.size <= 64 else LARGE_IMAGE_MODEL
    return name
