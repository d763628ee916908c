"""Writing one shard of ``hvdtrain convert``: a WebDataset tar or a Hugging Face-style Parquet file.

A shard is written to a hidden temporary name beside its final one (``.<name>.partial-<pid>``),
flushed and fsynced, renamed into place, and then recorded (``<work>/<name>.json``: samples, bytes,
SHA-256, and the digest of the sample list it was planned with). A shard is finished when its
record says so and the file has the recorded size; anything else (a temporary file of a killed
run, a shard renamed but not yet recorded) is redone. Output is deterministic: the same samples
give byte-identical files (tar headers with fixed mtime, owner and mode; pyarrow's Parquet writer
with fixed settings).

Naming, shared with the verifier (:mod:`hvdtrain.data.convert_verify`):

* WebDataset: ``<key>.<ext>`` (the source bytes, ``ext`` the source extension lowercased) and
  ``<key>.cls`` (the class index as decimal text), where the key is the image's path relative to
  the split folder without its extension, with every byte other than ``A-Z a-z 0-9 _ -`` written
  as ``%XX`` (so ``n01440764/n01440764_10026.JPEG`` is ``n01440764%2Fn01440764_10026``: no dot,
  which WebDataset readers take as the start of the extension, and no slash). Two files that
  differ only by extension keep it in the key (``x%2Ejpg``, ``x%2Epng``).
* Parquet: columns ``image`` (struct ``{bytes: binary, path: string}``, path = the relative path)
  and ``label`` (int64), schema metadata ``huggingface`` holding the features (an ``Image`` and a
  ``ClassLabel`` with the class names), row groups of :data:`ROW_GROUP` rows.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from hvdtrain.core.durable import atomic_write_text, fsync_path

FORMATS = ("webdataset", "parquet")
ROW_GROUP = 100             # Parquet rows per row group (as `datasets` wrote image datasets)
TAR_MTIME = 946684800       # 2000-01-01T00:00:00Z: a fixed time in every tar header
WORK_DIR = ".hvdtrain-convert"  # DEST's folder of shard records while a conversion is under way
PARTIAL = ".partial-"
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def escape(relpath: str) -> str:
    """``relpath`` with every byte outside ``A-Z a-z 0-9 _ -`` written as ``%XX`` (file system bytes,
    so names that are not UTF-8 work too); injective, and free of dots and slashes."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in os.fsencode(relpath))


def sample_keys(relpaths: list[str]) -> list[str]:
    """Unique WebDataset keys of one split's images: the escaped relative path without its extension,
    or with it (escaped) where two images would otherwise share a key."""
    stems = [escape(os.path.splitext(p)[0]) for p in relpaths]
    seen: dict[str, int] = {}
    for stem in stems:
        seen[stem] = seen.get(stem, 0) + 1
    return [stem if seen[stem] == 1 else escape(p) for stem, p in zip(stems, relpaths)]


def extension(relpath: str) -> str:
    """The WebDataset member extension of an image: its own, lowercased, without the dot."""
    return os.path.splitext(relpath)[1].lower().lstrip(".")


def path_text(relpath: str) -> str:
    """The relative path as Parquet's ``image.path`` string (bytes that are not UTF-8 as ``\\xNN``)."""
    return os.fsencode(relpath).decode("utf-8", "backslashreplace")


def shard_name(fmt: str, split: str, index: int, count: int) -> str:
    """The shard's path relative to DEST: ``<split>-%06d.tar`` or ``data/<split>-%05d-of-%05d.parquet``."""
    if fmt == "webdataset":
        return f"{split}-{index:06d}.tar"
    return f"data/{split}-{index:05d}-of-{count:05d}.parquet"


def hf_metadata(classes: list[str]) -> bytes:
    """The ``huggingface`` schema metadata that makes `datasets` read ``image`` as an Image and
    ``label`` as a ClassLabel of ``classes`` (exactly what ``datasets.Features.arrow_schema`` writes)."""
    features = {"image": {"_type": "Image"}, "label": {"names": list(classes), "_type": "ClassLabel"}}
    return json.dumps({"info": {"features": features}}).encode()


def parquet_schema(classes: list[str]):
    """The Arrow schema of a Parquet shard (``image`` struct, ``label`` int64, features metadata)."""
    import pyarrow as pa

    image = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])
    return pa.schema([pa.field("image", image), pa.field("label", pa.int64())],
                     metadata={b"huggingface": hf_metadata(classes)})


@dataclass
class ShardTask:
    """One shard to write: its samples (paths relative to ``root``, labels, keys) and where."""

    fmt: str
    dest: str
    name: str        # relative to dest
    root: str        # the split folder
    relpaths: list[str]
    labels: list[int]
    keys: list[str]
    classes: list[str]
    plan: str        # digest of the sample list (see :func:`plan_digest`)


def plan_digest(relpaths: list[str], labels: list[int], keys: list[str]) -> str:
    """SHA-256 of a shard's planned sample list (what its record must match to count as done)."""
    digest = hashlib.sha256()
    for relpath, label, key in zip(relpaths, labels, keys):
        digest.update(os.fsencode(relpath) + b"\0" + str(label).encode() + b"\0" + key.encode() + b"\n")
    return digest.hexdigest()


def record_path(dest: str | Path, name: str) -> Path:
    """Where the record of shard ``name`` lives while the conversion is under way."""
    return Path(dest) / WORK_DIR / (name.replace("/", "%2F") + ".json")


def finished(task: ShardTask) -> dict | None:
    """The shard's record if it is done (record for this plan, file present with the recorded size)."""
    try:
        record = json.loads(record_path(task.dest, task.name).read_text())
        size = (Path(task.dest) / task.name).stat().st_size
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("plan") != task.plan or record.get("bytes") != size:
        return None
    return {k: record[k] for k in ("name", "samples", "bytes", "sha256")}


def partial_of(name: str) -> str | None:
    """The shard file name whose temporary file ``name`` is (``.<shard>.partial-<pid>``), else None."""
    match = re.fullmatch(r"\.(.+)" + re.escape(PARTIAL) + r"\d+", name)
    return match.group(1) if match else None


def _write_tar(task: ShardTask, f) -> None:
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relpath, label, key in zip(task.relpaths, task.labels, task.keys):
            with open(os.path.join(task.root, relpath), "rb") as image:
                size = os.fstat(image.fileno()).st_size
                tar.addfile(_member(f"{key}.{extension(relpath)}", size), image)
            text = str(label).encode()
            tar.addfile(_member(f"{key}.cls", len(text)), io.BytesIO(text))


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, TAR_MTIME, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_parquet(task: ShardTask, f) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema(task.classes)
    with pq.ParquetWriter(f, schema, compression="snappy", write_statistics=["label"]) as writer:
        for start in range(0, len(task.relpaths), ROW_GROUP):
            rows = range(start, min(start + ROW_GROUP, len(task.relpaths)))
            data = []
            for i in rows:
                with open(os.path.join(task.root, task.relpaths[i]), "rb") as image:
                    data.append(image.read())
            images = pa.StructArray.from_arrays(
                [pa.array(data, pa.binary()), pa.array([path_text(task.relpaths[i]) for i in rows], pa.string())],
                fields=list(schema.field("image").type))
            labels = pa.array([task.labels[i] for i in rows], pa.int64())
            writer.write_table(pa.Table.from_arrays([images, labels], schema=schema), row_group_size=ROW_GROUP)


def file_digest(path: str | Path) -> tuple[int, str]:
    """(bytes, SHA-256 hex digest) of a file."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def write_shard(task: ShardTask) -> dict:
    """Write ``task``'s shard (temporary name, fsync, rename, record); return its manifest entry
    ``{"name", "samples", "bytes", "sha256"}``."""
    final = Path(task.dest) / task.name
    tmp = final.with_name(f".{final.name}{PARTIAL}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            (_write_tar if task.fmt == "webdataset" else _write_parquet)(task, f)
            f.flush()
            os.fsync(f.fileno())
        size, sha256 = file_digest(tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(final.parent)
    entry = {"name": task.name, "samples": len(task.relpaths), "bytes": size, "sha256": sha256}
    atomic_write_text(record_path(task.dest, task.name), json.dumps({**entry, "plan": task.plan}))
    return entry
