"""A compact index of one split of an image tree, built once and cached while the tree is unchanged.

Two layouts: ``split/<class>/<image>`` (ImageFolder) and a flat folder of images with a labels
file (the ImageNet validation set: a CSV of ``ImageId,PredictionString`` as in the challenge's
``LOC_val_solution.csv``, or plainly ``file,class``). The index holds the relative paths as one
byte array with offsets (the file system's bytes: names that are not UTF-8 work too) and the labels
as an int32 array, about 40 bytes per image (about 50 MB for ImageNet's 1.28 M files). Only the
headers of a sample of images spread over the split are read (:data:`SAMPLE`: their sizes and
modes tell the recipe what it is dealing with, so one thumbnail or one grayscale file does not).

The cache lives under ``$HVDTRAIN_DATA_CACHE/index`` (default ``~/.cache/hvdtrain/data/index``):
one folder per split (keyed by its absolute path) holding ``current.json`` and one entry folder
per built content, named by the SHA-256 of that content. ``current.json`` points at an entry and
is valid while the modification times of the split folder, its class folders and the labels file
are the ones recorded: adding, removing or renaming an image changes its folder's time. The first
process on a host to need it builds it under a file lock; the others wait, then memory-map the same
arrays (shared page cache, no copy). An entry never changes once published (files and folders are
fsynced before the rename that publishes them) and is deleted only when no live process holds it
(each holds a shared lock on the entry while it lives), so decoding workers that open it lazily by
path read the index their dataset was built from, even after the tree changed and a new entry was
built.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hvdtrain.core.durable import atomic_write_text, fsync_path

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
INDEX_VERSION = 2
SAMPLE = 32  # image headers read per split, spread evenly over the index
SINGLE_CHANNEL = ("1", "L", "LA", "La", "I", "F", "I;16", "I;16B", "I;16L", "I;16N")
POINTER = "current.json"
IN_USE = ".in-use"
_HELD: dict[str, object] = {}  # entry folder -> open file holding its shared lock (for this process's life)


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
    sample: list[tuple[int, int, str]] = field(default_factory=list)  # (width, height, mode) of sampled images
    built: bool = False          # True if this process built it (False: read from the cache)
    cache_dir: Path | None = None  # the entry folder (immutable)
    digest: str = ""             # SHA-256 of the entry's content (its folder's name)

    def __len__(self) -> int:
        return len(self.labels)

    def relpath(self, i: int) -> str:
        """Image ``i``'s path relative to :attr:`root`."""
        return os.fsdecode(bytes(self.blob[self.offsets[i]:self.offsets[i + 1]]))

    def path(self, i: int) -> Path:
        """Image ``i``'s full path."""
        return self.root / self.relpath(i)

    @property
    def nbytes(self) -> int:
        """Bytes of the index arrays (what each rank maps)."""
        return int(self.blob.nbytes + self.offsets.nbytes + self.labels.nbytes)

    @property
    def grayscale(self) -> bool:
        """True if most sampled images are single-channel (a tie is colour: converting grayscale to
        RGB loses nothing)."""
        gray = sum(mode in SINGLE_CHANNEL for _, _, mode in self.sample)
        return 2 * gray > len(self.sample)

    @property
    def native_size(self) -> tuple[int, int]:
        """(width, height): the (lower) medians of the sampled images' widths and heights."""
        widths = sorted(w for w, _, _ in self.sample)
        heights = sorted(h for _, h, _ in self.sample)
        return widths[(len(widths) - 1) // 2], heights[(len(heights) - 1) // 2]


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
    return hashlib.sha1("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


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
        prefix = os.fsencode(name) + b"/"
        names += [prefix + os.fsencode(f) for f in files]
        labels += [label] * len(files)
    return found, names, labels


def read_labels_file(path: Path) -> dict[str, str]:
    """Image id (file name without extension) -> class name, from an ImageNet solution CSV
    (``ImageId,PredictionString``, the class is the first word) or a ``file,class`` CSV. Read as
    UTF-8 with the file system's escapes for other bytes (so names that are not UTF-8 match the
    files they name); a line that is not CSV is an error naming the file."""
    mapping: dict[str, str] = {}
    with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
        reader = csv.reader(f)
        try:
            for row in reader:
                if len(row) < 2 or row[0].strip().lower() in ("imageid", "image", "file", "filename", "path"):
                    continue
                image, cls = row[0].strip(), row[1].strip().split()
                if image and cls:
                    mapping[os.path.splitext(os.path.basename(image))[0]] = cls[0]
        except csv.Error as exc:
            raise DataError(f"labels file {path} line {reader.line_num} is not CSV: {exc}") from None
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
        names.append(os.fsencode(name))
        labels.append(position[cls])
    return list(known), names, labels


def _sample_headers(split_dir: Path, names: list[bytes]) -> list[tuple[int, int, str]]:
    """``(width, height, mode)`` of up to :data:`SAMPLE` images spread evenly over ``names`` (only
    headers are read); unreadable ones are left out (the decoder reports or replaces them later)."""
    from PIL import Image

    positions = sorted(set(np.linspace(0, len(names) - 1, num=min(len(names), SAMPLE)).round().astype(int).tolist()))
    sample, error = [], None
    for position in positions:
        path = split_dir / os.fsdecode(names[position])
        try:
            with Image.open(path) as img:
                sample.append((int(img.size[0]), int(img.size[1]), str(img.mode)))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            error = error or f"cannot read image {path}: {exc}"
    if not sample:
        raise DataError(f"{error} (nor any of the other {len(positions) - 1} images sampled from {split_dir})")
    return sample


def _write_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


def _build(split_dir: Path, labels_file: Path | None, classes: list[str] | None, slot: Path, key: str) -> str:
    """Scan the split, publish its entry in ``slot`` (unless one with the same content exists),
    point ``current.json`` at it; return the entry's name."""
    if labels_file is not None:
        found, names, labels = _scan_flat(split_dir, labels_file, classes)
    else:
        found, names, labels = _scan_tree(split_dir, classes)
    lengths = np.fromiter((len(n) for n in names), dtype=np.int64, count=len(names))
    offsets = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.frombuffer(b"".join(names), dtype=np.uint8)
    label_array = np.asarray(labels, dtype=np.int32)
    sample = _sample_headers(split_dir, names)
    meta = {"version": INDEX_VERSION, "root": str(split_dir.resolve()), "classes": found,
            "sample": [list(s) for s in sample], "count": len(names)}
    digest = hashlib.sha256()
    for part in (blob, offsets, label_array):
        digest.update(np.ascontiguousarray(part).tobytes())
    digest.update(json.dumps({k: v for k, v in meta.items() if k != "root"}, sort_keys=True).encode())  # content only
    name = digest.hexdigest()
    entry = slot / name
    slot.mkdir(parents=True, exist_ok=True)
    if not (entry / "meta.json").is_file():
        tmp = slot / f".tmp-{name[:16]}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_npy(tmp / "blob.npy", blob)
        _write_npy(tmp / "offsets.npy", offsets)
        _write_npy(tmp / "labels.npy", label_array)
        with open(tmp / "meta.json", "w") as f:
            f.write(json.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        fsync_path(tmp)
        try:
            os.rename(tmp, entry)
        except OSError:  # published meanwhile by a builder on another host (a shared cache folder)
            shutil.rmtree(tmp, ignore_errors=True)
        fsync_path(slot)
    atomic_write_text(slot / POINTER, json.dumps({"key": key, "entry": name}))
    _prune(slot, keep=name)
    return name


def _prune(slot: Path, keep: str) -> None:
    """Delete the slot's other entries that no live process holds (see :func:`_hold`), and
    temporary folders of builders that died (called under the slot's build lock)."""
    for child in slot.iterdir():
        if child.name == keep or not child.is_dir():
            continue
        if child.name.startswith(".tmp-"):
            shutil.rmtree(child, ignore_errors=True)
            continue
        try:
            lock = open(child / IN_USE, "a")
        except OSError:
            continue
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live job maps it
            shutil.rmtree(child, ignore_errors=True)


def _hold(entry: Path) -> bool:
    """Take (once per process) a shared lock on ``entry`` that keeps builders from deleting it
    while this process lives; False if the entry is gone."""
    if str(entry) in _HELD:
        return True
    try:
        lock = open(entry / IN_USE, "a")
    except FileNotFoundError:
        return False
    except OSError:  # a read-only cache: nothing here can delete it either
        return (entry / "meta.json").is_file()
    fcntl.flock(lock, fcntl.LOCK_SH)
    if not (entry / "meta.json").is_file():  # deleted while we waited for the lock
        lock.close()
        return False
    _HELD[str(entry)] = lock
    return True


def _read(split_dir: Path, slot: Path, key: str) -> ImageIndex | None:
    try:
        pointer = json.loads((slot / POINTER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(pointer, dict) or pointer.get("key") != key:
        return None
    entry = slot / str(pointer.get("entry"))
    if not _hold(entry):
        return None
    try:
        meta = json.loads((entry / "meta.json").read_text())
        load = lambda name: np.load(entry / name, mmap_mode="r")  # noqa: E731
        arrays = load("blob.npy"), load("offsets.npy"), load("labels.npy")
    except (OSError, ValueError):
        return None
    sample = [(int(w), int(h), str(m)) for w, h, m in meta["sample"]]
    return ImageIndex(split_dir, list(meta["classes"]), *arrays, sample=sample, cache_dir=entry, digest=entry.name)


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
        key = hashlib.sha1((key + "\n" + "\n".join(classes)).encode("utf-8", "surrogateescape")).hexdigest()
    base = Path(cache) if cache else cache_root()
    slot = base / (hashlib.sha1(os.fsencode(split_dir.resolve())).hexdigest()[:16] + "-"
                   + os.fsencode(split_dir.name).decode("utf-8", "replace"))
    index = _read(split_dir, slot, key)
    if index is not None:
        return index
    base.mkdir(parents=True, exist_ok=True)
    with open(slot.with_name(slot.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per host; the others wait and read its result
        index = _read(split_dir, slot, key)
        if index is None:
            _build(split_dir, labels_path, classes, slot, key)
            index = _read(split_dir, slot, key)
            if index is None:
                raise DataError(f"the index of {split_dir} written to {slot} cannot be read back")
            index.built = True
    return index
