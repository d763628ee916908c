"""Data set-up shared by the torch and TensorFlow builders of the image-classification recipe."""

from __future__ import annotations

from recipes.image_classification.data import embedded_mnist, load_image_folder


def load_datasets(config, ctx, channels_first: bool):
    """Train and val datasets from ``--data`` or the embedded MNIST, and the number of classes."""
    root = config.data.path or embedded_mnist()
    train, val, classes = load_image_folder(
        root, image_size=config.data.image_size, augment=config.data.augment,
        channels_first=channels_first, seed=config.train.seed,
        max_train=config.data.max_train_samples, max_val=config.data.max_val_samples,
        bad_files=config.data.bad_files)
    skipped = train.skipped + val.skipped
    if skipped and ctx.is_main:
        print(f"hvdtrain: skipped {len(skipped)} unreadable image(s) (data.bad_files=skip), "
              f"first: {skipped[0]}", flush=True)
    num_classes = config.model.num_classes or len(classes)
    if num_classes < len(classes):
        raise ValueError(f"model.num_classes={num_classes} is smaller than the {len(classes)} class "
                         f"folders found in {root}")
    return train, val, num_classes
