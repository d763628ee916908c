"""``hvdtrain convert --verify DEST SRC``: read a conversion's shards back and check them against the tree.

The shards are read directly (``tarfile``, ``pyarrow.parquet``), not through a dataset reader, and
checked against the manifest (each shard's size and SHA-256, sample counts, the class names also
in Parquet's features metadata) and against the source as the cached index enumerates it: every
source image is in exactly one shard, with byte-identical content (SHA-256), the same extension
(WebDataset) and the same label; no shard holds anything else. Shards and source files are read
in ``workers`` processes. Problems are collected, not raised one at a time, so one run names them all.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hvdtrain.data.convert import MANIFEST, ConvertError, load_splits
from hvdtrain.data.convert_pool import run_tasks, start_pool
from hvdtrain.data.convert_shards import FORMATS, ROW_GROUP, extension, file_digest, path_text, sample_keys

SOURCE_CHUNK = 512   # source images hashed per task
KEPT = 1000          # problems kept (the count goes on)


@dataclass
class VerifyResult:
    """What :func:`verify` found: ``problems`` (the first :data:`KEPT`), their total, samples and shards read."""

    problems: list[str] = field(default_factory=list)
    total: int = 0
    samples: int = 0
    shards: int = 0
    seconds: float = 0.0

    def add(self, problem: str) -> None:
        self.total += 1
        if len(self.problems) < KEPT:
            self.problems.append(problem)

    @property
    def ok(self) -> bool:
        return self.total == 0


def _read_tar(path: str, name: str) -> tuple[list[tuple], list[str]]:
    """Samples ``(key, ext, label, sha256)`` of a WebDataset tar, and the problems met reading it."""
    samples: dict[str, list] = {}
    problems = []
    with tarfile.open(path, mode="r:") as tar:
        for member in tar:
            if not member.isfile():
                problems.append(f"shard {name} holds {member.name!r}, which is not a file")
                continue
            key, dot, ext = member.name.partition(".")
            if not dot or "/" in member.name:
                problems.append(f"shard {name} holds {member.name!r}, not named <key>.<ext>")
                continue
            data = tar.extractfile(member).read()
            sample = samples.setdefault(key, [key, None, None, None])
            if ext == "cls":
                text = data.decode("ascii", "replace").strip()
                if sample[2] is not None or not text.isdigit():
                    problems.append(f"shard {name} key {key}: " + (
                        "two .cls members" if sample[2] is not None else f".cls holds {text[:20]!r}, not a class index"))
                    continue
                sample[2] = int(text)
            elif sample[1] is not None:
                problems.append(f"shard {name} key {key}: two images (.{sample[1]} and .{ext})")
            else:
                sample[1], sample[3] = ext, hashlib.sha256(data).digest()
    for key, ext, label, _ in samples.values():
        if ext is None or label is None:
            problems.append(f"shard {name} key {key}: no " + ("image member" if ext is None else ".cls member"))
    return [tuple(s) for s in samples.values()], problems


def _read_parquet(path: str, name: str, classes: list[str]) -> tuple[list[tuple], list[str]]:
    """Samples ``(path, ext, label, sha256)`` of a Parquet shard, and the problems met reading it."""
    import pyarrow.parquet as pq

    problems = []
    file = pq.ParquetFile(path)
    names = file.schema_arrow.names
    if "image" not in names or "label" not in names:
        return [], [f"shard {name} has columns {names}, not image and label"]
    try:
        features = json.loads(file.schema_arrow.metadata[b"huggingface"])["info"]["features"]
        found = features["label"]["names"]
        if features["image"].get("_type") != "Image" or found != classes:
            problems.append(f"shard {name}: its features metadata gives {features['image'].get('_type')} and the "
                            f"classes {found[:5]}..., not Image and the manifest's classes")
    except (KeyError, TypeError, ValueError):
        problems.append(f"shard {name} has no Hugging Face features metadata (schema metadata 'huggingface')")
    samples = []
    for batch in file.iter_batches(batch_size=ROW_GROUP, columns=["image", "label"]):
        for image, label in zip(batch.column("image").to_pylist(), batch.column("label").to_pylist()):
            data = image.get("bytes") if image else None
            where = (image or {}).get("path") or ""
            if data is None:
                problems.append(f"shard {name} row {where!r}: no image bytes")
                continue
            samples.append((where, extension(where), label, hashlib.sha256(data).digest()))
    return samples, problems


def _job(job: tuple) -> tuple:
    """One unit of work in a verifying process: read a shard, or hash a chunk of source images."""
    if job[0] == "source":
        _, root, relpaths = job
        digests = []
        for relpath in relpaths:
            try:
                with open(os.path.join(root, relpath), "rb") as f:
                    digests.append(hashlib.sha256(f.read()).digest())
            except OSError:
                digests.append(None)
        return ("source", digests)
    _, fmt, path, name, classes = job
    if not os.path.isfile(path):
        return ("shard", None, None, [], [f"shard {name} is missing"])
    size, sha256 = file_digest(path)
    try:
        samples, problems = _read_tar(path, name) if fmt == "webdataset" else _read_parquet(path, name, classes)
    except Exception as exc:  # noqa: BLE001  (any reader failure is this shard's problem, named)
        return ("shard", size, sha256, [], [f"shard {name} cannot be read: {type(exc).__name__}: {exc}"])
    return ("shard", size, sha256, samples, problems)


def verify(dest: str | Path, src: str | Path, *, val_labels: str | Path | None = None, workers: int = 1,
           cache: str | Path | None = None) -> VerifyResult:
    """Check the conversion in ``dest`` against the tree ``src`` (see the module's docstring)."""
    if workers < 1:
        raise ConvertError(f"--workers {workers} must be at least 1")
    start = time.perf_counter()
    dest = Path(dest)
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
        splits = manifest["splits"]
        if manifest["format"] not in FORMATS or not isinstance(manifest["classes"], list):
            raise ValueError(f"format {manifest['format']!r}, classes {str(manifest['classes'])[:40]}")
    except FileNotFoundError:
        raise ConvertError(f"{dest} holds no {MANIFEST}: not a finished conversion (run hvdtrain convert first, "
                           f"or again to finish it)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConvertError(f"{dest / MANIFEST} is not a conversion manifest: {exc}") from None
    labels_files = {name: (s or {}).get("labels_file") for name, s in (manifest.get("source") or {}).get("splits", {}).items()}
    labels = (val_labels or labels_files.get("val")) if "val" in splits else None
    pool = start_pool(workers, ("pyarrow.parquet",) if manifest["format"] == "parquet" else ())
    try:
        return _verify(dest, src, manifest, labels, pool, cache, start)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _verify(dest: Path, src: str | Path, manifest: dict, labels: str | None, pool, cache, start: float) -> VerifyResult:
    fmt, splits, recorded = manifest["format"], manifest["splits"], manifest["classes"]
    classes, loaded = load_splits(src, list(splits), labels, cache)
    result = VerifyResult()
    if recorded != classes:
        result.add(f"the manifest's classes {recorded[:5]}... are not the source's {classes[:5]}...")
    jobs, owners = [], []
    for name, index, _ in loaded:
        relpaths = [index.relpath(i) for i in range(len(index))]
        for a in range(0, len(relpaths), SOURCE_CHUNK):
            jobs.append(("source", str(index.root), relpaths[a:a + SOURCE_CHUNK]))
            owners.append((name, a))
        for entry in splits[name]["shards"]:
            jobs.append(("shard", fmt, str(dest / entry["name"]), entry["name"], classes))
            owners.append((name, entry))
    outputs: list = [None] * len(jobs)
    run_tasks(_job, jobs, pool, lambda i, out: outputs.__setitem__(i, out))

    listed = {entry["name"] for split in splits.values() for entry in split["shards"]}
    for folder in (dest, dest / "data"):
        if folder.is_dir():
            for child in sorted(folder.iterdir()):
                rel = child.relative_to(dest).as_posix()
                if child.name.endswith((".tar", ".parquet")) and rel not in listed:
                    result.add(f"shard {rel} is not in the manifest")
    for name, index, _ in loaded:
        relpaths = [index.relpath(i) for i in range(len(index))]
        idents = sample_keys(relpaths) if fmt == "webdataset" else [path_text(p) for p in relpaths]
        position = {ident: i for i, ident in enumerate(idents)}
        source: list = [None] * len(relpaths)
        seen: dict[str, str] = {}
        for (owner, where), out in zip(owners, outputs):
            if owner != name:
                continue
            if out[0] == "source":
                source[where:where + len(out[1])] = out[1]
        for (owner, entry), out in zip(owners, outputs):
            if owner != name or out[0] != "shard":
                continue
            _, size, sha256, samples, problems = out
            result.shards += 1
            for problem in problems:
                result.add(problem)
            shard = entry["name"]
            if size is not None and (size != entry["bytes"] or sha256 != entry["sha256"]):
                result.add(f"shard {shard} has {size} bytes, SHA-256 {sha256[:16]}..., not the manifest's "
                           f"{entry['bytes']} bytes, {entry['sha256'][:16]}...")
            if size is not None and len(samples) != entry["samples"] and not problems:
                result.add(f"shard {shard} holds {len(samples)} samples, not the manifest's {entry['samples']}")
            for ident, ext, label, digest in samples:
                result.samples += 1
                i = position.get(ident)
                if i is None:
                    result.add(f"shard {shard} holds {ident!r}, which is not an image of {index.root}")
                    continue
                if ident in seen:
                    result.add(f"{index.root / relpaths[i]} is in shard {seen[ident]} and again in shard {shard}")
                    continue
                seen[ident] = shard
                if ext != extension(relpaths[i]) and ext is not None:
                    result.add(f"shard {shard} key {ident}: extension .{ext}, not .{extension(relpaths[i])}")
                if digest is not None and digest != source[i]:
                    result.add(f"shard {shard} {ident!r}: the image bytes differ from {index.root / relpaths[i]}"
                               + (" (unreadable)" if source[i] is None else ""))
                if label is not None and label != int(index.labels[i]):
                    shown = classes[label] if 0 <= label < len(classes) else "no class"
                    result.add(f"shard {shard} {ident!r}: label {label} ({shown}), but "
                               f"{index.root / relpaths[i]} is {int(index.labels[i])} ({classes[int(index.labels[i])]})")
        missing = [relpaths[i] for i, ident in enumerate(idents) if ident not in seen]
        for relpath in missing[:5]:
            result.add(f"{index.root / relpath} is in no shard of split {name}")
        result.total += max(0, len(missing) - 5)
        if splits[name].get("samples") != len(relpaths):
            result.add(f"the manifest gives split {name} {splits[name].get('samples')} samples; the source has "
                       f"{len(relpaths)}")
    result.seconds = time.perf_counter() - start
    return result
