"""Data set-up shared by the torch and TensorFlow builders of the image-classification recipe."""

from __future__ import annotations

import numpy as np

from hvdtrain.data.normalize import normalize_numpy
from hvdtrain_recipes.image_classification.config import ImageConfig
from hvdtrain.data.mnist import embedded_mnist
from hvdtrain_recipes.image_classification.data import default_workers, is_remote, load_image_folder
from hvdtrain_recipes.image_classification.hf_models import HFImageModel, apply_preprocessing, is_hf_model, resolve

LARGE_IMAGE_MODEL = "resnet50"
_POOLS: dict[int, object] = {}


def image_section(config) -> ImageConfig:
    """The run's ``image`` section (its defaults for a recipe that does not declare it)."""
    return config.sections.get("image") or ImageConfig()


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


def _pool(workers: int):
    """One decoding pool per process and worker count, started from the calling (main) thread."""
    if workers not in _POOLS:
        from hvdtrain.data.workers import WorkerPool

        _POOLS[workers] = WorkerPool(workers)
    return _POOLS[workers]


def load_image_data(config, ctx):
    """uint8 NHWC train and val datasets from ``--data`` or the embedded MNIST, and the number of classes."""
    image = image_section(config)
    hf = hf_model(config)
    if hf is not None:  # the checkpoint's size and resize/crop, unless the user set them
        image = apply_preprocessing(image, hf)
    root = config.data.path or (None if is_remote(None, image) else embedded_mnist())
    workers = default_workers(ctx.local_size) if image.workers is None else image.workers
    train, val, classes = load_image_folder(
        root, image, seed=config.train.seed, max_train=config.data.max_train_samples,
        max_val=config.data.max_val_samples, pool=_pool(workers) if workers > 0 else None,
        world_size=ctx.data_size, shuffle=config.data.shuffle)
    if config.train.elastic and train.stream is not None and image.stream_lanes is None:
        raise ValueError("train.elastic=true streams the shards (image.read): set image.stream_lanes (for example to "
                         "the largest world size) so the streaming order stays the same when workers come and go")
    num_classes = config.model.num_classes or len(classes)
    if num_classes < len(classes):
        raise ValueError(f"model.num_classes={num_classes} is smaller than the {len(classes)} class "
                         f"folders found in {root}")
    if ctx.is_main and hf is not None:
        pre = hf.preprocessing
        print(f"hvdtrain: model: Hugging Face {hf.model_type} from {hf.path}; its preprocessing: {pre.size}x{pre.size}, "
              f"{f'resize + centre crop {pre.crop:g}' if pre.crop else 'resize'}, mean {list(pre.mean)} std "
              f"{list(pre.std)} (unless image.size or image.transform is set); a new {num_classes}-class head",
              flush=True)
    if ctx.is_main:
        index = train.index
        print(f"hvdtrain: images: {len(train.index):,} train / {len(val.index):,} val files in {len(classes)} classes "
              f"(index {'built' if index.built else 'cached'}: {index.nbytes / 2**20:.1f} MiB); "
              f"{train.policy.size}x{train.policy.size}x{train.channels}, {train.policy.kind}: {train.policy.describe()}; "
              f"{workers or 'no'} decoding worker(s) per rank{_streaming(train, image)}", flush=True)
    return train, val, num_classes


def _streaming(train, image) -> str:
    """How the shards are read, for the start-up line."""
    if train.stream is None:
        return ""
    return (f"; streamed from {train.index.root} in {train.stream.plan.lanes} lane(s), spool of up to "
            f"{image.spool_shards} shards / {image.spool_mb} MiB per rank")


def model_name(config, train) -> str:
    """``model.name``, with ``auto`` resolved: small_cnn up to 64 pixels, else ResNet-50."""
    name = config.model.name
    if name == "auto":
        return "small_cnn" if train.policy.size <= 64 else LARGE_IMAGE_MODEL
    return name


class FloatImages:
    """A uint8 image dataset seen as normalised float32 batches (NCHW with ``channels_first``), for
    recipes that feed the model host-side floats."""

    def __init__(self, images, channels_first: bool):
        self.images, self.channels_first = images, channels_first
        self.image_size, self.channels = images.image_size, images.channels

    def __len__(self) -> int:
        return len(self.images)

    def fingerprint(self) -> str:
        """The uint8 dataset's fingerprint (hvdtrain.core.dataset_check compares it across ranks)."""
        return self.images.fingerprint()

    def get_batch(self, indices: np.ndarray, epoch: int):
        """Normalised float32 images and int64 labels."""
        x, y = self.images.get_batch(indices, epoch)
        return normalize_numpy(x, self.channels_first), y


def load_datasets(config, ctx, channels_first: bool):
    """Float32 normalised train and val datasets (NCHW with ``channels_first``) and the number of classes."""
    train, val, num_classes = load_image_data(config, ctx)
    return FloatImages(train, channels_first), FloatImages(val, channels_first), num_classes
