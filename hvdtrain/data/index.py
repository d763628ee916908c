"""A compact index of one split of an image tree, built once and cached while the tree is unchanged.

Two layouts: ``split/<class>/<image>`` (ImageFolder) and a flat folder of images with a labels
file (the ImageNet validation set: a CSV of ``ImageId,PredictionString`` as in the challenge's
``LOC_val_solution.csv``, or plainly ``file,class``). The index holds the relative paths as one
UTF-8 byte array with offsets and the labels as an int32 array, about 40 bytes per image (about
50 MB for ImageNet's 1.28 M files); no image is opened except the first (its size and mode tell
the recipe what it is dealing with).

The cache lives under ``$HVDTRAIN_DATA_CACHE/index`` (default ``~/.cache/hvdtrain/data/index``),
keyed by the split's absolute path. It is valid while the modification times of the split
folder, its class folders and the labels file are the ones recorded: adding, removing or renaming
an image changes its folder's time. The first process on a host to need it builds it under a
file lock; the others wait, then memory-map the same arrays (shared page cache, no copy).
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
INDEX_VERSION = 1


class DataError(ValueError):
    """The data directory is missing, empty, or inconsistent, or an image cannot be decoded; the
    message names the file or folder."""


@dataclass
class ImageIndex:
    """One split: ``root`` (the split folder), class names, and per image its relative path and label."""

    root: Path
    classes: list[str]
    blob: np.ndarray      # uint8: every relative path, UTF-8, back to back
    offsets: np.ndarray   # int64, len + 1: path i is blob[offsets[i]:offsets[i + 1]]
    labels: np.ndarray    # int32
    first_size: tuple[int, int]  # (width, height) of the first image
    first_mode: str              # its Pillow mode ("L", "RGB", ...)
    built: bool = False          # True if this process built it (False: read from the cache)
    cache_dir: Path | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def relpath(self, i: int) -> str:
        """Image ``i``'s path relative to :attr:`root`."""
        return bytes(self.blob[self.offsets[i]:self.offsets[i + 1]]).decode("utf-8")

    def path(self, i: int) -> Path:
        """Image ``i``'s full path."""
        return self.root / self.relpath(i)

    @property
    def nbytes(self) -> int:
        """Bytes of the index arrays (what each rank maps)."""
        return int(self.blob.nbytes + self.offsets.nbytes + self.labels.nbytes)

    @property
    def grayscale(self) -> bool:
        """True if the first image is single-channel."""
        return self.first_mode in ("L", "1", "I;16", "I", "LA")


def cache_root() -> Path:
    """Where indexes are cached."""
    base = Path(os.environ.get("HVDTRAIN_DATA_CACHE", Path.home() / ".cache" / "hvdtrain" / "data"))
    return base / "index"


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _class_dirs(split_dir: Path) -> list[os.DirEntry]:
    with os.scandir(split_dir) as it:
        return sorted((e for e in it if e.is_dir() and not e.name.startswith(".")), key=lambda e: e.name)


def _fingerprint(split_dir: Path, labels_file: Path | None) -> str:
    """Modification times of the split folder, its class folders and the labels file."""
    parts = [str(split_dir.resolve()), str(split_dir.stat().st_mtime_ns), str(INDEX_VERSION)]
    if labels_file is not None:
        parts += [str(labels_file.resolve()), str(labels_file.stat().st_mtime_ns)]
    else:
        parts += [f"{e.name}:{e.stat().st_mtime_ns}" for e in _class_dirs(split_dir)]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()


def _scan_tree(split_dir: Path, classes: list[str] | None) -> tuple[list[str], list[bytes], list[int]]:
    dirs = _class_dirs(split_dir)
    found = [e.name for e in dirs]
    if not found:
        raise DataError(f"{split_dir} has no class folders; expected {split_dir}/<class>/<image files> "
                        f"(or a flat folder of images with image.val_labels)")
    names: list[bytes] = []
    labels: list[int] = []
    for label, name in enumerate(found):
        with os.scandir(split_dir / name) as it:
            files = sorted(e.name for e in it if _is_image(e.name))
        if not files:
            raise DataError(f"class folder {split_dir / name} holds no images "
                            f"(extensions: {', '.join(IMAGE_EXTENSIONS)})")
        prefix = name + "/"
        names += [(prefix + f).encode("utf-8") for f in files]
        labels += [label] * len(files)
    return found, names, labels


def read_labels_file(path: Path) -> dict[str, str]:
    """Image id (file name without extension) -> class name, from an ImageNet solution CSV
    (``ImageId,PredictionString``, the class is the first word) or a ``file,class`` CSV."""
    mapping: dict[str, str] = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) < 2 or row[0].strip().lower() in ("imageid", "image", "file", "filename", "path"):
                continue
            image, cls = row[0].strip(), row[1].strip().split()
            if image and cls:
                mapping[os.path.splitext(os.path.basename(image))[0]] = cls[0]
    if not mapping:
        raise DataError(f"labels file {path} holds no rows of image,class")
    return mapping


def _scan_flat(split_dir: Path, labels_file: Path, classes: list[str] | None) -> tuple[list[str], list[bytes], list[int]]:
    mapping = read_labels_file(labels_file)
    with os.scandir(split_dir) as it:
        files = sorted(e.name for e in it if _is_image(e.name))
    if not files:
        raise DataError(f"{split_dir} holds no images (extensions: {', '.join(IMAGE_EXTENSIONS)})")
    known = classes if classes is not None else sorted(set(mapping.values()))
    position = {c: i for i, c in enumerate(known)}
    names, labels = [], []
    for name in files:
        cls = mapping.get(os.path.splitext(name)[0])
        if cls is None:
            raise DataError(f"image {split_dir / name} has no row in the labels file {labels_file}")
        if cls not in position:
            raise DataError(f"labels file {labels_file} gives {name} the class {cls!r}, which is not a class "
                            f"folder of the training set")
        names.append(name.encode("utf-8"))
        labels.append(position[cls])
    return list(known), names, labels


def _first_header(split_dir: Path, names: list[bytes]) -> tuple[tuple[int, int], str]:
    """Size and mode of the first readable image among the first few (an unreadable one is left
    for the decoder to report or replace)."""
    from PIL import Image

    error = None
    for name in names[:16]:
        path = split_dir / name.decode("utf-8")
        try:
            with Image.open(path) as img:
                return img.size, img.mode
        except (OSError, SyntaxError, ValueError) as exc:
            error = error or f"cannot read image {path}: {exc}"
    raise DataError(f"{error} (nor any of the next {min(len(names), 16) - 1} images)")


def _build(split_dir: Path, labels_file: Path | None, classes: list[str] | None, target: Path, key: str) -> None:
    if labels_file is not None:
        found, names, labels = _scan_flat(split_dir, labels_file, classes)
    else:
        found, names, labels = _scan_tree(split_dir, classes)
    lengths = np.fromiter((len(n) for n in names), dtype=np.int64, count=len(names))
    offsets = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.frombuffer(b"".join(names), dtype=np.uint8)
    size, mode = _first_header(split_dir, names)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "blob.npy", blob)
    np.save(tmp / "offsets.npy", offsets)
    np.save(tmp / "labels.npy", np.asarray(labels, dtype=np.int32))
    (tmp / "meta.json").write_text(json.dumps({"key": key, "root": str(split_dir.resolve()), "classes": found,
                                               "first_size": list(size), "first_mode": mode, "count": len(names)}))
    shutil.rmtree(target, ignore_errors=True)
    os.rename(tmp, target)


def _read(split_dir: Path, target: Path, key: str) -> ImageIndex | None:
    try:
        meta = json.loads((target / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("key") != key:
        return None
    load = lambda name: np.load(target / name, mmap_mode="r")  # noqa: E731
    return ImageIndex(split_dir, list(meta["classes"]), load("blob.npy"), load("offsets.npy"), load("labels.npy"),
                      tuple(meta["first_size"]), meta["first_mode"], cache_dir=target)


def load_index(split_dir: str | Path, labels_file: str | Path | None = None,
               classes: list[str] | None = None, cache: str | Path | None = None) -> ImageIndex:
    """The index of ``split_dir`` from the cache, or built now (once per host, under a lock).

    ``labels_file`` marks a flat folder with a labels CSV; ``classes`` (the training set's) fixes
    the label numbers of such a folder.
    """
    split_dir = Path(split_dir)
    if not split_dir.is_dir():
        raise DataError(f"data folder {split_dir} does not exist; expected an ImageFolder tree "
                        f"root/{{train,val}}/<class>/<image files>")
    labels_path = Path(labels_file) if labels_file else None
    if labels_path is not None and not labels_path.is_file():
        raise DataError(f"labels file {labels_path} does not exist")
    key = _fingerprint(split_dir, labels_path)
    if labels_path is not None and classes is not None:
        key = hashlib.sha1((key + "\n" + "\n".join(classes)).encode()).hexdigest()
    base = Path(cache) if cache else cache_root()
    target = base / (hashlib.sha1(str(split_dir.resolve()).encode()).hexdigest()[:16] + "-" + split_dir.name)
    index = _read(split_dir, target, key)
    if index is not None:
        return index
    base.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per host; the others wait and read its result
        index = _read(split_dir, target, key)
        if index is None:
            _build(split_dir, labels_path, classes, target, key)
            index = _read(split_dir, target, key)
            if index is None:
                raise DataError(f"the index of {split_dir} written to {target} cannot be read back")
            index.built = True
    return index
