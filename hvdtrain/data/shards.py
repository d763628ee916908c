"""Index image datasets stored as shards: WebDataset tars, Parquet and Arrow (Hugging Face ``datasets``).

No image is decoded (a sample of :data:`~hvdtrain.data.index.SAMPLE` headers is parsed); each
sample gets a location for :mod:`hvdtrain.data.reader`:

* **WebDataset tar** (``.tar``, uncompressed): members ``<key>.<ext>`` (an image extension) and
  ``<key>.cls`` (the class index as text) or ``<key>.json`` (``{"label": int or class name}``);
  the key is the member name up to the first dot of its base name. Location: the image member's
  byte span (from the tar headers). Class names: ``classes`` of a ``manifest.json`` beside the
  shards (or in their parent folder), else the labels found.
* **Parquet** as the Hub stores image datasets: an image column of struct ``{bytes, path}`` and a
  label column (int ClassLabel, or names); class names from the schema's ``huggingface``
  metadata (features -> label -> names). Location: (shard, row group, row in the group).
* **Arrow** (``datasets`` ``save_to_disk``: IPC stream files ``data-*.arrow``): the same columns;
  location: the byte span of each image value inside the (uncompressed, memory-mappable) file,
  from the binary column's offsets buffer.

Class names found without a list: integer labels give ``"0" .. str(max)`` (a label is its class
index), names are sorted. The validation split is given the training split's classes. The index
is cached per host like an ImageFolder's (:mod:`hvdtrain.data.entries`), keyed by every shard's
path, size and modification time.

Remote shards (URLs, :mod:`hvdtrain.data.remote`) are indexed the same way: a tar or Arrow file is
copied once to a temporary local file (:data:`SCAN_DOWNLOADS` at a time, never past the size its
server gave), scanned there and deleted (reading tar headers one range
request each would cost a request per member); a Parquet file's footer and label column are read
by range requests. The cache key holds each URL's size and ETag (or Last-Modified). A remote
``manifest.json`` is looked up on the shards' host (beside the first shard, then one folder up,
never above the server's root) and read only up to :data:`~hvdtrain.data.remote.MANIFEST_BYTES`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tarfile
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hvdtrain.data import remote
from hvdtrain.core.redact import redact_text
from hvdtrain.data.convert_shards import WORK_DIR as CONVERT_WORK_DIR
from hvdtrain.data.entries import load_entry, slot_path
from hvdtrain.data.index import ARRAYS, DataError, ImageIndex, index_of, key_arrays, sample_headers
from hvdtrain.data.reader import SampleReader

FORMATS = ("webdataset", "parquet", "arrow")
EXTENSIONS = {"webdataset": (".tar",), "parquet": (".parquet",), "arrow": (".arrow",)}
TAR_IMAGES = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "gif", "tif", "tiff")
IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMNS = ("label", "labels")
SHARD_INDEX_VERSION = 1
SCAN_DOWNLOADS = 4  # remote tar/Arrow shards copied at once while the index is built
MAX_CLASSES = 1_000_000  # class indexes without a class list: names "0".."N-1" are built for them


class Scan:
    """What scanning gives: per sample its key, raw label (int, name or None), shard and (a, b)."""

    def __init__(self):
        self.keys: list[bytes] = []
        self.labels: list = []
        self.shard: list[np.ndarray] = []
        self.a: list[np.ndarray] = []
        self.b: list[np.ndarray] = []
        self.names: list[str] | None = None  # class names the data declares
        self.column: str | None = None

    def add(self, shard: int, keys: list[bytes], labels: list, a, b) -> None:
        """Append one shard's samples."""
        self.keys += keys
        self.labels += labels
        self.shard.append(np.full(len(keys), shard, dtype=np.int64))
        self.a.append(np.asarray(a, dtype=np.int64))
        self.b.append(np.asarray(b, dtype=np.int64))

    def where(self) -> np.ndarray:
        """The ``(n, 3)`` location array."""
        if not self.shard:
            return np.zeros((0, 3), dtype=np.int64)
        return np.stack([np.concatenate(self.shard), np.concatenate(self.a), np.concatenate(self.b)], axis=1)


# --- WebDataset tars -------------------------------------------------------------------------------

def _split_name(name: str) -> tuple[str, str]:
    """WebDataset's ``(key, extension)`` of a member name: the base name splits at its first dot."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower() if dot else ""


def _parse_label(shard: Path, key: str, ext: str, data: bytes):
    """The raw label of member ``key.ext``: an int, a class name, or an error naming it."""
    try:
        text = data.decode("utf-8").strip()
        if ext == "json":
            value = json.loads(text)
            value = value.get("label") if isinstance(value, dict) else value
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise ValueError(f"no int or str 'label' in {text[:80]!r}")
            return int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else value
        return int(text) if text.lstrip("-").isdigit() else text
    except (UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"shard {shard}: sample {key!r}: unreadable label member {key}.{ext}: {exc}") from None


class _Special(Exception):
    """A header only :mod:`tarfile` reads (pax, GNU long names, base-256 sizes)."""


def _truncated(path: Path, last: str | None, what: str) -> DataError:
    after = f" after member {last}" if last is not None else ""
    return DataError(f"shard {path} is truncated{after}: {what} (a copy cut short?)")


def _ustar_members(path: Path, fd: int, size: int) -> list[tuple[str, int, int, bytes | None]]:
    """``(name, data offset, size, data if at most 512 bytes)`` of the regular members of a plain
    ustar/GNU tar, read header by header (one ``pread`` each, the small members' data included);
    raises :class:`_Special` at a header only :mod:`tarfile` reads."""
    members, offset, last = [], 0, None
    while True:
        block = os.pread(fd, 1024, offset)
        if len(block) < 512:
            raise _truncated(path, last, "it ends inside a header" if block else "it lacks the end-of-archive marker")
        header = block[:512]
        if header.count(0) == 512:
            if len(block) < 1024 or block[512:].count(0) != 512:
                raise _truncated(path, last, "it lacks the end-of-archive marker")
            return members
        flag = header[156:157]
        if flag not in (b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7") or header[124] & 0x80:
            raise _Special()
        if offset == 0 and int(header[148:156].split(b"\0", 1)[0].strip() or b"-1", 8) != \
                sum(header[:148]) + 256 + sum(header[156:]):
            raise DataError(f"shard {path} is not a tar file (its first header's checksum does not match)")
        try:
            length = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            raise DataError(f"shard {path}: the header after member {last} is not a tar header") from None
        name = header[:100].split(b"\0", 1)[0]
        if header[257:262] == b"ustar" and header[345]:
            name = header[345:500].split(b"\0", 1)[0] + b"/" + name
        last = name.decode("utf-8", "surrogateescape")
        if offset + 512 + length > size:
            raise DataError(f"shard {path} is truncated: member {last} needs bytes up to {offset + 512 + length:,}, "
                            f"the file has {size:,}")
        if flag in (b"0", b"\0"):
            members.append((last, offset + 512, length, block[512:512 + length] if length <= 512 else None))
        offset += 512 + (length + 511) // 512 * 512


def _tarfile_members(path: Path, raw, size: int) -> list[tuple[str, int, int, bytes | None]]:
    """The same as :func:`_ustar_members`, through :mod:`tarfile` (pax and GNU headers)."""
    members, last = [], None
    try:
        with tarfile.open(fileobj=raw, mode="r:") as tar:
            for info in tar:
                last = info.name
                if info.offset_data + info.size > size:
                    raise DataError(f"shard {path} is truncated: member {info.name} needs bytes up to "
                                    f"{info.offset_data + info.size:,}, the file has {size:,}")
                if info.isfile():
                    members.append((info.name, info.offset_data, info.size, None))
            tail = os.pread(raw.fileno(), 1024, tar.offset)
    except tarfile.ReadError as exc:
        after = f" after member {last}" if last is not None else ""
        raise DataError(f"shard {path} is not a readable tar{after}: {exc} (truncated or not a tar file)") from None
    if len(tail) < 1024 or tail.strip(b"\0"):
        raise _truncated(path, last, "it lacks the end-of-archive marker")
    return members


def scan_tar(path: Path, shard: int, scan: Scan) -> None:
    """Index one WebDataset tar from its headers (labels read from their small members)."""
    if path.name.lower().endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")):
        raise DataError(f"shard {path} is compressed: random access needs plain .tar shards (recompress them "
                        f"without compression; JPEG/PNG members gain nothing from it)")
    size = path.stat().st_size
    samples: dict[str, dict] = {}
    with open(path, "rb") as raw:
        try:
            members = _ustar_members(path, raw.fileno(), size)
        except _Special:
            members = _tarfile_members(path, raw, size)
        for name, offset, length, head in members:
            key, ext = _split_name(name)
            if not key or key.startswith("__"):  # webdataset's own metadata members
                continue
            sample = samples.setdefault(key, {"exts": []})
            if ext in TAR_IMAGES and "image" not in sample:
                sample["image"] = (offset, length)
            elif ext in ("cls", "json") and "label" not in sample:
                data = head if head is not None else os.pread(raw.fileno(), length, offset)
                sample["label"] = _parse_label(path, key, ext, data)
            sample["exts"].append(ext)
    keys, labels, a, b = [], [], [], []
    for key, sample in samples.items():
        if "image" not in sample:
            raise DataError(f"shard {path}: sample {key!r} has no image member (members: "
                            f"{', '.join(key + '.' + e for e in sample['exts'])}; image extensions: "
                            f"{', '.join(TAR_IMAGES)})")
        if "label" not in sample:
            raise DataError(f"shard {path}: sample {key!r} has no label (no {key}.cls or {key}.json member; "
                            f"members: {', '.join(key + '.' + e for e in sample['exts'])})")
        keys.append(key.encode("utf-8", "surrogateescape"))
        labels.append(sample["label"])
        a.append(sample["image"][0])
        b.append(sample["image"][1])
    if not keys:
        raise DataError(f"shard {path} holds no samples (members <key>.<image extension> + <key>.cls or .json)")
    scan.add(shard, keys, labels, a, b)


def manifest_places(first: str | Path) -> list:
    """Where :func:`manifest_classes` looks for the ``manifest.json`` of shard ``first``: beside it,
    then in its parent folder, each once; for a URL on its host, never above the server's root (a
    shard at ``http://host/`` looked up ``http://manifest.json``, a host of that name, and
    ``s3://bucket/`` the bucket ``manifest.json``)."""
    first = str(first)
    if remote.is_url(first):
        folder = remote.folder(first)
        return list(dict.fromkeys([remote.join(folder, "manifest.json"), remote.join(folder, "../manifest.json")]))
    return list(dict.fromkeys([Path(first).parent / "manifest.json", Path(first).parent.parent / "manifest.json"]))


def manifest_classes(shards: list) -> list[str] | None:
    """``classes`` of a ``manifest.json`` beside the first shard or in its parent folder."""
    for manifest in manifest_places(shards[0]):
        text = _manifest_text(manifest)
        if text is None:
            continue
        try:
            classes = json.loads(text).get("classes")
        except (ValueError, AttributeError) as exc:
            raise DataError(f"manifest {manifest} is not a JSON object: {exc}") from None
        if classes is not None:
            if not isinstance(classes, list) or not classes:
                raise DataError(f"manifest {manifest}: 'classes' must be a non-empty list of class names")
            return [str(c) for c in classes]
    return None


def _manifest_text(manifest) -> str | None:
    """A manifest's text, or None if there is none; a remote one larger than
    :data:`~hvdtrain.data.remote.MANIFEST_BYTES` is refused without being read past that."""
    if isinstance(manifest, Path):
        if not manifest.is_file():
            return None
        try:
            return manifest.read_text()
        except OSError as exc:
            raise DataError(f"manifest {manifest} cannot be read: {exc}") from None
    data = remote.read_small(manifest, "manifest")
    return None if data is None else data.decode("utf-8", "replace")


# --- Parquet and Arrow -----------------------------------------------------------------------------

def _features(schema) -> dict:
    """The ``datasets`` features stored in an Arrow schema's ``huggingface`` metadata ({} if none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        return json.loads(raw).get("info", {}).get("features", {}) or {} if raw else {}
    except (ValueError, AttributeError):
        return {}


def pick_columns(schema, path: Path, image_column: str | None, label_column: str | None):
    """``(image column, label column, class names or None, image bytes path)`` of a schema."""
    import pyarrow as pa

    names = schema.names
    features = _features(schema)
    if image_column is None:
        typed = [n for n in names if isinstance(features.get(n), dict) and features[n].get("_type") == "Image"]
        image_column = (typed or [n for n in IMAGE_COLUMNS if n in names] or [None])[0]
        if image_column is None:
            raise DataError(f"{path} has no image column (an Image feature, or one named {' or '.join(IMAGE_COLUMNS)}); "
                            f"its columns: {', '.join(names)}; set image.image_column")
    elif image_column not in names:
        raise DataError(f"{path} has no column image.image_column={image_column!r}; its columns: {', '.join(names)}")
    if label_column is None:
        label_column = next((n for n in LABEL_COLUMNS if n in names), None)
        if label_column is None:
            raise DataError(f"{path} has no label column (named {' or '.join(LABEL_COLUMNS)}); its columns: "
                            f"{', '.join(names)}; set image.label_column")
    elif label_column not in names:
        raise DataError(f"{path} has no column image.label_column={label_column!r}; its columns: {', '.join(names)}")
    kind = schema.field(image_column).type
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        value_path = f"{image_column}.bytes"
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        value_path = image_column
    else:
        raise DataError(f"{path}: column {image_column!r} is {kind}, not an image (struct{{bytes, path}} or binary)")
    label = features.get(label_column)
    names_declared = label.get("names") if isinstance(label, dict) and label.get("_type") == "ClassLabel" else None
    return image_column, label_column, names_declared, value_path


def _struct_child(array, name: str):
    """Child ``name`` of a struct array (None if the struct has none)."""
    import pyarrow as pa

    if pa.types.is_struct(array.type) and array.type.get_field_index(name) >= 0:
        return array.field(name)
    return None


def _keys(image, start: int) -> list[bytes]:
    """Keys of an image column's rows: their ``path`` where set, else ``row N`` of the shard."""
    paths = _struct_child(image, "path")
    values = paths.to_pylist() if paths is not None else [None] * len(image)
    return [(p or f"row {start + i}").encode("utf-8", "surrogateescape") for i, p in enumerate(values)]


def _columns(scan: Scan, schema, path: Path, image_column, label_column):
    image_column, label_column, names, value_path = pick_columns(schema, path, image_column, label_column)
    if scan.column is not None and scan.column != value_path:
        raise DataError(f"shard {path}'s image column {value_path!r} differs from the first shard's {scan.column!r}")
    scan.column = value_path
    if names is not None:
        if scan.names is not None and scan.names != names:
            raise DataError(f"shard {path} declares other class names than the first shard")
        scan.names = list(names)
    return image_column, label_column


def scan_parquet(path: Path, shard: int, scan: Scan, image_column: str | None, label_column: str | None) -> None:
    """Index one Parquet file: (row group, row) of each sample, labels and keys (no image read)."""
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(remote.open_file(str(path)) if remote.is_url(path) else path)
    except remote.RemoteError:
        raise
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001  (pyarrow raises ArrowInvalid/OSError for a bad file)
        raise DataError(f"shard {path} is not a readable Parquet file: {exc}") from None
    image_column, label_column = _columns(scan, file.schema_arrow, path, image_column, label_column)
    fields = [f"{image_column}.path"] if _has_path(file.schema_arrow, image_column) else []
    table = file.read(columns=[label_column, *fields])
    labels = table.column(label_column).to_pylist()
    paths = table.column(1).combine_chunks().field("path").to_pylist() if fields else [None] * len(labels)
    groups = [file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups)]
    a = np.repeat(np.arange(len(groups)), groups)
    b = np.concatenate([np.arange(n) for n in groups]) if groups else np.zeros(0)
    keys = [(p or f"row {i}").encode("utf-8", "surrogateescape") for i, p in enumerate(paths)]
    scan.add(shard, keys, labels, a, b)


def _has_path(schema, column: str) -> bool:
    import pyarrow as pa

    kind = schema.field(column).type
    return pa.types.is_struct(kind) and kind.get_field_index("path") >= 0


def scan_arrow(path: Path, shard: int, scan: Scan, image_column: str | None, label_column: str | None) -> None:
    """Index one Arrow IPC stream file: the byte span of each image value in the file."""
    import pyarrow as pa

    keys, labels, a, b = [], [], [], []
    try:
        with pa.memory_map(str(path)) as source:
            whole = source.read_buffer()
            reader = pa.ipc.open_stream(whole)
            image_column, label_column = _columns(scan, reader.schema, path, image_column, label_column)
            for batch in reader:
                image = batch.column(image_column)
                values = _struct_child(image, "bytes") if scan.column.endswith(".bytes") else image
                offset_type = np.int64 if pa.types.is_large_binary(values.type) else np.int32
                validity, offsets, data = values.buffers()
                if data is None:  # an all-null or empty column
                    data_start = 0
                else:
                    data_start = data.address - whole.address
                    if not 0 <= data_start <= whole.size:
                        raise DataError(f"shard {path}: the image values are not stored in the file as written "
                                        f"(a compressed Arrow file?); save it uncompressed or use Parquet")
                ends = np.frombuffer(offsets, dtype=offset_type)[values.offset:values.offset + len(values) + 1]
                a.append(data_start + ends[:-1].astype(np.int64))
                b.append(np.diff(ends).astype(np.int64))
                nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False))
                b[-1][nulls] = -1  # no image bytes: named when read
                keys += _keys(image, len(keys))
                labels += batch.column(label_column).to_pylist()
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"shard {path} is not a readable Arrow IPC stream file: {exc}") from None
    scan.add(shard, keys, labels, np.concatenate(a) if a else [], np.concatenate(b) if b else [])


# --- labels, classes, the cached index --------------------------------------------------------------

def assign_labels(scan: Scan, classes: list[str] | None, shards: list[Path]) -> tuple[list[str], np.ndarray]:
    """Class names and int32 labels: ``classes`` (given or declared) fix the numbering; otherwise
    integer labels are class indexes (names ``"0" .. str(max)``) and names are sorted."""
    def name_of(i: int) -> str:
        shard = shards[int(np.concatenate(scan.shard)[i])]
        return f"shard {shard}: sample {scan.keys[i].decode('utf-8', 'replace')!r}"

    missing = next((i for i, label in enumerate(scan.labels) if label is None), None)
    if missing is not None:
        raise DataError(f"{name_of(missing)} has no label")
    ints = [isinstance(v, (int, np.integer)) for v in scan.labels]
    if classes is None:
        if all(ints):
            top = max(range(len(scan.labels)), key=scan.labels.__getitem__, default=0)
            if scan.labels and not 0 <= scan.labels[top] < MAX_CLASSES:  # one class per number: bounded
                raise DataError(f"{name_of(top)} has the class index {scan.labels[top]}; without a class list "
                                f"(manifest.json 'classes') a class index must be in 0-{MAX_CLASSES - 1:,}")
            classes = [str(i) for i in range(int(max(scan.labels)) + 1)] if scan.labels else []
        elif not any(ints):
            classes = sorted(set(scan.labels))
        else:
            first = ints.index(True)
            other = ints.index(False)
            raise DataError(f"labels mix class indexes and names: {name_of(first)} has {scan.labels[first]!r}, "
                            f"{name_of(other)} has {scan.labels[other]!r}")
    position = {c: i for i, c in enumerate(classes)}
    labels = np.empty(len(scan.labels), dtype=np.int32)
    for i, (value, is_int) in enumerate(zip(scan.labels, ints)):
        label = int(value) if is_int else position.get(value, -1)
        if not 0 <= label < len(classes):
            shown = ", ".join(classes[:10]) + (f" ... ({len(classes)} in all)" if len(classes) > 10 else "")
            raise DataError(f"{name_of(i)} has the label {value!r}, which is not a class of the training set "
                            f"(classes: {shown})")
        labels[i] = label
    return list(classes), labels


def check_conversion(shards: list[Path]) -> dict[str, tuple[int, Path]]:
    """Refuse local shards that ``hvdtrain convert`` has not finished, or that no longer match its
    ``manifest.json`` (beside the shards or in their parent folder, where :func:`manifest_classes`
    looks): a folder holding ``.hvdtrain-convert/`` (a conversion under way or killed: some shards
    missing, no manifest), and, for every split of the manifest that lists one of ``shards``,
    each of its shards missing or of another size than recorded (deleted, truncated, replaced).
    Before, such a split trained on what was left, silently. A DataError names the folder or shard
    and the manifest. Costs one ``stat`` per listed shard. Returns, per given shard the manifest
    lists, its recorded sample count and the manifest (checked when the index is built)."""
    given = {os.path.normpath(s) for s in shards}
    recorded: dict[str, tuple[int, Path]] = {}
    for folder in dict.fromkeys(p for s in shards for p in (s.parent, s.parent.parent)):
        if (folder / CONVERT_WORK_DIR).is_dir():
            raise DataError(f"{folder} holds an unfinished hvdtrain convert ({CONVERT_WORK_DIR}/ and no finished "
                            f"manifest.json): run the same hvdtrain convert command again to finish it (its finished "
                            f"shards are kept), then train")
        manifest = folder / "manifest.json"
        if not manifest.is_file():
            continue
        try:
            splits = json.loads(manifest.read_text()).get("splits")
        except (OSError, ValueError, AttributeError):
            continue  # not a conversion manifest (manifest_classes names one it cannot read)
        if not isinstance(splits, dict):
            continue
        for name, split in splits.items():
            entries = split.get("shards") if isinstance(split, dict) else None
            if not isinstance(entries, list) or not all(
                    isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("bytes"), int)
                    for e in entries):
                continue  # not hvdtrain convert's split (a manifest of another tool): nothing to check
            paths = [os.path.normpath(folder / e["name"]) for e in entries]
            if not given.intersection(paths):
                continue
            for path, entry in zip(paths, entries):
                try:
                    size = os.stat(path).st_size
                except OSError:
                    raise DataError(f"shard {path} of split {name} is missing: {manifest} lists {len(entries)} "
                                    f"shard(s) of {split.get('samples', '?')} samples; restore it or convert "
                                    f"again") from None
                if size != entry["bytes"]:
                    raise DataError(f"shard {path} has {size:,} bytes, {manifest} records {entry['bytes']:,}: it "
                                    f"was changed or cut short since the conversion; restore it or convert again")
                if path in given and isinstance(entry.get("samples"), int):
                    recorded[path] = (entry["samples"], manifest)
    return recorded


def check_recorded_counts(scan: Scan, shards: list, recorded: dict[str, tuple[int, Path]]) -> None:
    """Every scanned shard the conversion's manifest lists holds the samples it records."""
    if not recorded or not scan.shard:
        return
    counts = np.bincount(np.concatenate(scan.shard), minlength=len(shards))
    for i, shard in enumerate(shards):
        samples, manifest = recorded.get(os.path.normpath(shard), (None, None))
        if samples is not None and counts[i] != samples:
            raise DataError(f"shard {shard} holds {counts[i]:,} samples, {manifest} records {samples:,}: the "
                            f"shard and the manifest disagree; restore them or convert again")


def _fingerprint(fmt: str, shards: list, options: list, stats: dict[str, tuple[int, str]]) -> str:
    parts = [str(SHARD_INDEX_VERSION), fmt, json.dumps(options)]
    for shard in shards:
        if remote.is_url(shard):
            size, version = stats[shard]
            parts.append(f"{shard}:{size}:{version}")
            continue
        stat = shard.stat()
        parts.append(f"{shard.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
    if not remote.is_url(shards[0]):
        for folder in {shards[0].parent, shards[0].parent.parent}:
            manifest = folder / "manifest.json"
            if manifest.is_file():
                parts.append(f"{manifest.resolve()}:{manifest.stat().st_mtime_ns}")
    return hashlib.sha1("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


@contextlib.contextmanager
def _scannable(shard, download: tuple[Future, str] | None):
    """A local path of ``shard`` to scan: the shard itself, or the temporary copy ``download``
    (``(its download, its path)``) made of a remote tar or Arrow file, deleted afterwards; errors
    name the URL."""
    if download is None:
        yield shard
        return
    future, copy = download
    try:
        future.result()
        yield Path(copy)
    except DataError as exc:
        raise DataError(str(exc).replace(copy, shard)) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(copy)


def _build(fmt: str, shards: list, root, classes: list[str] | None, image_column: str | None,
           label_column: str | None, recorded: dict[str, tuple[int, Path]] | None = None,
           stats: dict[str, tuple[int, str]] | None = None) -> tuple[dict, dict]:
    scan = Scan()
    copied = [remote.is_url(s) and fmt != "parquet" for s in shards]  # remote Parquet: footers read in place
    downloads: dict[int, tuple[Future, str]] = {}
    with tempfile.TemporaryDirectory(prefix="hvdtrain-scan-") as scratch:
        pool = ThreadPoolExecutor(SCAN_DOWNLOADS, thread_name_prefix="hvdtrain-scan") if any(copied) else None
        try:
            for i, shard in enumerate(shards):
                for j in range(i, min(i + SCAN_DOWNLOADS, len(shards))):  # the next few copies, under way
                    if copied[j] and j not in downloads:
                        copy = os.path.join(scratch, f"{j:06d}-{os.path.basename(shards[j].rstrip('/')) or 'shard'}")
                        size = stats[shards[j]][0]  # what the server said: never downloaded past it
                        downloads[j] = (pool.submit(remote.fetch, shards[j], copy, size), copy)
                with _scannable(shard, downloads.pop(i, None)) as path:
                    if fmt == "webdataset":
                        scan_tar(path, i, scan)
                    elif fmt == "parquet":
                        scan_parquet(path, i, scan, image_column, label_column)
                    else:
                        scan_arrow(path, i, scan, image_column, label_column)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
    check_recorded_counts(scan, shards, recorded or {})
    if not scan.keys:
        raise DataError(f"the {fmt} shards {shards[0]} ... hold no samples")
    declared = manifest_classes(shards) if fmt == "webdataset" else scan.names
    if classes is not None and declared is not None and list(declared) != list(classes):
        raise DataError(f"the shards {shards[0]} ... declare other classes than the training set's: "
                        f"only here: {sorted(set(declared) - set(classes)) or 'none'}; only in train: "
                        f"{sorted(set(classes) - set(declared)) or 'none'}")
    found, labels = assign_labels(scan, classes if classes is not None else declared, shards)
    blob, offsets = key_arrays(scan.keys)
    where = scan.where()
    kind = "row" if fmt == "parquet" else "span"
    relative = [remote.relative(str(root), str(s)) for s in shards]
    reader = SampleReader(str(root), kind, relative, blob, offsets, where, scan.column)
    sample = sample_headers(reader, len(labels), f"{shards[0]} ...")
    # "root" is information only (the readers get the live root): never a secret of its URL
    meta = {"version": SHARD_INDEX_VERSION, "root": redact_text(str(root)), "classes": found, "kind": kind, "format": fmt,
            "shards": relative, "column": scan.column, "sample": [list(s) for s in sample], "count": len(labels)}
    return {"blob": blob, "offsets": offsets, "labels": labels, "where": where}, meta


def load_shard_index(shards: list[str | Path], fmt: str, *, classes: list[str] | None = None,
                     image_column: str | None = None, label_column: str | None = None,
                     cache: str | Path | None = None) -> ImageIndex:
    """The index of one split stored as ``shards`` (in this order) of format ``fmt`` (one of
    :data:`FORMATS`), from the cache or built now (once per host, under a lock). ``classes`` (the
    training split's) fixes the label numbers of a validation split."""
    if fmt not in FORMATS:
        raise DataError(f"unknown shard format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not shards:
        raise DataError(f"no {fmt} shards given")
    recorded: dict[str, tuple[int, Path]] = {}
    if any(remote.is_url(s) for s in shards):
        shards = [str(s) for s in shards]
        root = remote.common_root(shards)
    else:
        shards = [Path(remote.local_path(str(s))).absolute() for s in shards]
        missing = [s for s in shards if not s.is_file()]
        if missing:
            raise DataError(f"shard {missing[0]} does not exist ({len(missing)} of {len(shards)} missing)")
        recorded = check_conversion(shards)
        root = Path(os.path.commonpath([s.parent for s in shards]))
    options = [classes, image_column, label_column]
    stats = {s: remote.stat(s) for s in shards if remote.is_url(s)}  # (size, version): the cache key, the copies' bound
    key = _fingerprint(fmt, shards, options, stats)
    identity = "\n".join([fmt, *map(str, shards), json.dumps(options)]).encode("utf-8", "surrogateescape")
    stem = Path(str(shards[0]).rsplit("/", 1)[-1]).stem
    label = f"{fmt}-{stem}".encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    slot = slot_path(cache, identity, label)
    entry, meta, arrays, built = load_entry(slot, key, ARRAYS,
                                            lambda: _build(fmt, shards, root, classes, image_column, label_column,
                                                           recorded, stats))
    return index_of(root, entry, meta, arrays, built)
