"""A compact index of one split of an image dataset, built once and cached while the data is unchanged.

Every sample has a key (bytes, for error messages and ImageFolder paths), an int32 label and a
location (:mod:`hvdtrain.data.reader`): a whole file (ImageFolder), a byte span of a shard (WebDataset
tar, Arrow) or a row of a Parquet shard (scanned by :mod:`hvdtrain.data.shards`). This module
scans ImageFolder trees: ``split/<class>/<image>`` and a flat folder of images with a labels file
(the ImageNet validation set: a CSV of ``ImageId,PredictionString`` as in the challenge's
``LOC_val_solution.csv``, or plainly ``file,class``). The keys are one byte array with offsets (the
file system's bytes: names that are not UTF-8 work too), about 40 bytes per image for a tree (about
50 MB for ImageNet's 1.28 M files), about 60 for shards. Only the headers of a sample of images
spread over the split are read (:data:`SAMPLE`: their sizes and modes tell the recipe what it is
dealing with, so one thumbnail or one grayscale file does not).

Caching (:mod:`hvdtrain.data.entries`): a tree's entry is valid while the modification times of
the split folder, its class folders and the labels file are the ones recorded (adding, removing or
renaming an image changes its folder's time); built once per host under a lock, memory-mapped by
every rank, never changed under a live job.
"""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hvdtrain.data.entries import load_entry, slot_path
from hvdtrain.data.errors import DataError  # noqa: F401  (raised here, imported from here by callers)
from hvdtrain.data.reader import SampleReader

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# What Pillow may open (whatever a file's name): the formats of IMAGE_EXTENSIONS and of the shards'
# members (shards.TAR_IMAGES adds .ppm; a camera's multi-picture JPEG opens as JPEG). Not every
# format Pillow knows: EPS (through Ghostscript), PSD, FLI and the others are refused as unreadable.
PILLOW_FORMATS = ("JPEG", "PNG", "BMP", "GIF", "WEBP", "TIFF", "PPM")
INDEX_VERSION = 2
SAMPLE = 32  # image headers read per split, spread evenly over the index
SINGLE_CHANNEL = ("1", "L", "LA", "La", "I", "F", "I;16", "I;16B", "I;16L", "I;16N")
ARRAYS = ("blob", "offsets", "labels", "where")


@dataclass
class ImageIndex:
    """One split: ``root`` (the split folder, or the folder the shard paths are relative to), class
    names, and per sample its key, label and location (``where``: None for ImageFolder, else
    ``(shard, a, b)`` rows of the :mod:`~hvdtrain.data.reader` kind ``kind``)."""

    root: Path
    classes: list[str]
    blob: np.ndarray      # uint8: every key (relative path for ImageFolder), back to back
    offsets: np.ndarray   # int64, len + 1: key i is blob[offsets[i]:offsets[i + 1]]
    labels: np.ndarray    # int32
    sample: list[tuple[int, int, str]] = field(default_factory=list)  # (width, height, mode) of sampled images
    built: bool = False          # True if this process built it (False: read from the cache)
    cache_dir: Path | None = None  # the entry folder (immutable)
    digest: str = ""             # SHA-256 of the entry's content (its folder's name)
    kind: str = "file"           # file | span | row (see hvdtrain.data.reader)
    shards: list[str] = field(default_factory=list)  # shard paths relative to root
    where: np.ndarray | None = None  # int64 (n, 3): shard, a, b
    column: str | None = None    # the image column (Parquet)

    def __len__(self) -> int:
        return len(self.labels)

    def relpath(self, i: int) -> str:
        """Sample ``i``'s key: its path relative to :attr:`root` for ImageFolder."""
        return os.fsdecode(bytes(self.blob[self.offsets[i]:self.offsets[i + 1]]))

    def path(self, i: int) -> Path:
        """The file holding sample ``i`` (the image, or its shard)."""
        return self.reader().file(i)

    def reader(self) -> SampleReader:
        """A reader of this index's samples (see :mod:`hvdtrain.data.reader`)."""
        return SampleReader(str(self.root), self.kind, self.shards, self.blob, self.offsets, self.where, self.column)

    @property
    def nbytes(self) -> int:
        """Bytes of the index arrays (what each rank maps)."""
        extra = self.where.nbytes if self.where is not None else 0
        return int(self.blob.nbytes + self.offsets.nbytes + self.labels.nbytes + extra)

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


def key_arrays(keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``(blob, offsets)`` of a list of keys."""
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer(b"".join(keys), dtype=np.uint8), offsets


def open_image(data: bytes):
    """Pillow's image of the encoded ``data``, opened only as one of :data:`PILLOW_FORMATS`; another
    format raises Pillow's UnidentifiedImageError (an OSError) saying which formats are read."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data), formats=PILLOW_FORMATS)
    except UnidentifiedImageError:
        raise UnidentifiedImageError(f"not an image in a format read here ({', '.join(PILLOW_FORMATS)}; "
                                     f"{bytes(data[:8])!r}...)") from None


def sample_headers(reader: SampleReader, count: int, where: str) -> list[tuple[int, int, str]]:
    """``(width, height, mode)`` of up to :data:`SAMPLE` images spread evenly over the ``count``
    samples (only headers are parsed); unreadable ones are left out (the decoder reports or
    replaces them later). ``where`` names the data in the error if none is readable."""
    from PIL import Image

    positions = sorted(set(np.linspace(0, count - 1, num=min(count, SAMPLE)).round().astype(int).tolist()))
    sample, error = [], None
    for position in positions:
        try:
            with open_image(reader.read(position)) as img:
                sample.append((int(img.size[0]), int(img.size[1]), str(img.mode)))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            error = error or f"cannot read image {reader.name(position)}: {exc}"
    reader.close()
    if not sample:
        raise DataError(f"{error} (nor any of the other {len(positions) - 1} images sampled from {where})")
    return sample


def index_of(root: Path, entry: Path, meta: dict, arrays: dict[str, np.ndarray], built: bool) -> ImageIndex:
    """The :class:`ImageIndex` of a cache entry."""
    sample = [(int(w), int(h), str(m)) for w, h, m in meta["sample"]]
    return ImageIndex(root, list(meta["classes"]), arrays["blob"], arrays["offsets"], arrays["labels"], sample=sample,
                      built=built, cache_dir=entry, digest=entry.name, kind=meta.get("kind", "file"),
                      shards=list(meta.get("shards", [])), where=arrays.get("where"), column=meta.get("column"))


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


def _build(split_dir: Path, labels_file: Path | None, classes: list[str] | None) -> tuple[dict, dict]:
    """Scan the split: the entry's arrays and meta."""
    if labels_file is not None:
        found, names, labels = _scan_flat(split_dir, labels_file, classes)
    else:
        found, names, labels = _scan_tree(split_dir, classes)
    blob, offsets = key_arrays(names)
    label_array = np.asarray(labels, dtype=np.int32)
    sample = sample_headers(SampleReader(str(split_dir), "file", [], blob, offsets, None), len(names), str(split_dir))
    meta = {"version": INDEX_VERSION, "root": str(split_dir.resolve()), "classes": found, "kind": "file",
            "sample": [list(s) for s in sample], "count": len(names)}
    return {"blob": blob, "offsets": offsets, "labels": label_array}, meta


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
    slot = slot_path(cache, os.fsencode(split_dir.resolve()), os.fsencode(split_dir.name).decode("utf-8", "replace"))
    entry, meta, arrays, built = load_entry(slot, key, ARRAYS, lambda: _build(split_dir, labels_path, classes))
    return index_of(split_dir, entry, meta, arrays, built)
