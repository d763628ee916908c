"""``hvdtrain convert``: an image tree into WebDataset tar shards or Hugging Face-style Parquet files.

The source is an ImageFolder tree ``SRC/<split>/<class>/<images>``, or a flat validation folder
``SRC/val`` with a labels CSV (ImageNet's ``LOC_val_solution.csv`` or ``file,class``), enumerated
through the cached index (:func:`hvdtrain.data.index.load_index`), which also numbers the classes:
the class folders of ``SRC/train`` where it exists (every other split must have the same), else
those of the first split converted. The samples of each split are put in a seeded random order
(``shuffle_seed``, default 0; None keeps the index's sorted order) and cut into shards of about
``shard_size`` bytes or of ``samples_per_shard`` samples. Shuffling is the default because an
ImageFolder tree is sorted by class: in sorted order each shard would hold one or two classes, and
readers that stream whole shards (with a shuffle buffer of a few thousand samples) would feed
batches of one class; shuffled, every shard is a sample of the whole split. The seed is fixed, so
the output is still deterministic.

Output in DEST (:mod:`hvdtrain.data.convert_shards` writes the shards):

* ``webdataset``: ``DEST/<split>-000000.tar`` ... (``<split>-{000000..N}.tar`` as a brace pattern);
* ``parquet``: ``DEST/data/<split>-00000-of-0000N.parquet`` (the Hugging Face Hub's layout);
* ``DEST/manifest.json``: ``format``, ``classes``, ``splits`` (per split its ``shards``, each with
  ``name``, ``samples``, ``bytes`` and ``sha256``, and its ``samples``), ``source`` (the tree, and
  per split its labels file and index digest), ``options`` and ``created_by``.

Shards are written by ``workers`` processes, whole shards each. A conversion killed midway and
run again with the same arguments keeps the finished shards and writes only the others (records
in ``DEST/.hvdtrain-convert`` until the manifest is written). DEST must be new, empty, or hold this
same conversion: another conversion's output, or any file that is not this conversion's, is
refused by name; nothing of the user's is ever overwritten.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from hvdtrain._version import __version__
from hvdtrain.core.durable import atomic_write_text, fsync_path
from hvdtrain.data.convert_pool import run_tasks, start_pool
from hvdtrain.data.convert_shards import (FORMATS, WORK_DIR, ShardTask, finished, partial_of, plan_digest,
                                          sample_keys, shard_name, write_shard)
from hvdtrain.data.index import IMAGE_EXTENSIONS, DataError, ImageIndex, load_index

MANIFEST = "manifest.json"
PLAN = "plan.json"
DEFAULT_SHARD_SIZE = 256 * 10**6
TAR_OVERHEAD = 1536         # per sample in a tar: the image's header, the .cls member's header and block
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30, "GIB": 2**30, "TIB": 2**40}


class ConvertError(ValueError):
    """A conversion that cannot start or finish: bad arguments, a DEST that is not this
    conversion's, a source split that cannot be read; the message names the value or file."""


def parse_size(text: str | int) -> int:
    """Bytes from ``256MB``, ``1GiB``, ``500000`` (KB/MB/GB are powers of 10, KiB/MiB/GiB of 2)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < 1:
        raise ConvertError(f"shard size {text!r} is not a size: give bytes or a number with one of "
                           f"KB, MB, GB, KiB, MiB, GiB (e.g. 256MB)")
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass
class SplitPlan:
    """One split: its index, the sample order, and the shards it is cut into."""

    name: str
    index: ImageIndex
    labels_file: str | None
    shards: list[ShardTask] = field(default_factory=list)


@dataclass
class Plan:
    """Everything a conversion writes, decided before the first shard is: same arguments and the
    same source give the same plan (and :attr:`identity`), whatever the number of workers."""

    fmt: str
    src: Path
    dest: Path
    classes: list[str]
    splits: list[SplitPlan]
    options: dict

    @property
    def identity(self) -> dict:
        """What a DEST must record to be this conversion's (to be resumed rather than refused)."""
        return {"format": self.fmt, "classes": self.classes, "source": self.source, "options": self.options}

    @property
    def source(self) -> dict:
        """The source tree, and per split its labels file, index digest and sample count."""
        return {"path": str(self.src), "splits": {s.name: {"labels_file": s.labels_file, "index": s.index.digest,
                                                           "samples": len(s.index)} for s in self.splits}}

    @property
    def tasks(self) -> list[ShardTask]:
        """Every shard, split after split."""
        return [task for split in self.splits for task in split.shards]


def _is_flat(folder: Path) -> bool:
    with os.scandir(folder) as it:
        entries = [e for e in it if not e.name.startswith(".")]
    return not any(e.is_dir() for e in entries) and any(e.name.lower().endswith(IMAGE_EXTENSIONS) for e in entries)


def load_splits(src: str | Path, splits: list[str] | tuple[str, ...] = (), val_labels: str | Path | None = None,
                cache: str | Path | None = None) -> tuple[list[str], list[tuple[str, ImageIndex, str | None]]]:
    """The classes and, per split, ``(name, index, labels file)`` of an image tree (default splits:
    whichever of train and val exist). The classes are ``SRC/train``'s where it exists, else the
    first split's; every ImageFolder split must have the same class folders; a flat split (``val``
    only) is labelled through ``val_labels`` with these class numbers."""
    src = Path(src)
    if not src.is_dir():
        raise ConvertError(f"source folder {src} does not exist; expected an ImageFolder tree "
                           f"SRC/{{train,val}}/<class>/<image files>")
    names = list(dict.fromkeys(splits)) or [s for s in ("train", "val") if (src / s).is_dir()]
    if not names:
        raise ConvertError(f"{src} holds neither train nor val; expected SRC/{{train,val}}/<class>/<image files> "
                           f"(or name the split folders with --split)")
    for name in names:
        if not name or "/" in name or name.startswith(".") or not (src / name).is_dir():
            present = sorted(e.name for e in src.iterdir() if e.is_dir() and not e.name.startswith("."))
            raise ConvertError(f"split {name!r} is not a folder of {src}; its folders: {', '.join(present) or 'none'}")
    if val_labels is not None and "val" not in names:
        raise ConvertError(f"--val-labels {val_labels} labels the val split, which is not converted "
                           f"(splits: {', '.join(names)})")
    reference = None
    if (src / "train").is_dir() and not _is_flat(src / "train"):
        reference = load_index(src / "train", cache=cache).classes
    loaded = []
    for name in names:
        folder = src / name
        labels = val_labels if name == "val" else None
        if labels is None and _is_flat(folder):
            raise ConvertError(f"{folder} is a flat folder of images: " + (
                "give its labels CSV with --val-labels (ImageNet's LOC_val_solution.csv, or file,class)"
                if name == "val" else "only val may be flat (with --val-labels); expected <class>/<image files>"))
        index = load_index(folder, labels_file=labels, classes=reference if labels else None, cache=cache)
        if reference is None:
            reference = index.classes
        if index.classes != reference:
            only_ref = sorted(set(reference) - set(index.classes))
            only_here = sorted(set(index.classes) - set(reference))
            raise ConvertError(f"class folders of {folder} differ from the training set's: missing "
                               f"{only_ref[:5] or 'none'}; extra {only_here[:5] or 'none'}")
        loaded.append((name, index, str(Path(labels).resolve()) if labels else None))
    return list(reference), loaded


def _cut(sizes: np.ndarray, shard_size: int | None, per_shard: int | None) -> list[tuple[int, int]]:
    """[start, end) ranges over samples of the given byte sizes: ``per_shard`` samples each, or
    closed when the next sample would pass ``shard_size`` (at least one sample each)."""
    n = len(sizes)
    if per_shard:
        return [(s, min(s + per_shard, n)) for s in range(0, n, per_shard)]
    ranges, start, total = [], 0, 0
    for i, size in enumerate(sizes.tolist()):
        if i > start and total + size > shard_size:
            ranges.append((start, i))
            start, total = i, 0
        total += size
    if start < n:
        ranges.append((start, n))
    return ranges


def check_options(fmt: str, shard_size: int | str | None, samples_per_shard: int | None, workers: int = 1) -> int | None:
    """Raise on a bad format, shard size or worker count; return the target bytes per shard (None:
    ``samples_per_shard`` counts)."""
    if fmt not in FORMATS:
        raise ConvertError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    if workers < 1:
        raise ConvertError(f"--workers {workers} must be at least 1")
    if shard_size is not None and samples_per_shard is not None:
        raise ConvertError("give --shard-size or --samples-per-shard, not both")
    if samples_per_shard is not None and samples_per_shard < 1:
        raise ConvertError(f"--samples-per-shard {samples_per_shard} must be at least 1")
    return None if samples_per_shard else parse_size(shard_size if shard_size is not None else DEFAULT_SHARD_SIZE)


def make_plan(src: str | Path, dest: str | Path, fmt: str, splits: list[str] | tuple[str, ...] = (),
              shard_size: int | str | None = None, samples_per_shard: int | None = None,
              val_labels: str | Path | None = None, shuffle_seed: int | None = 0,
              cache: str | Path | None = None) -> Plan:
    """Decide every shard of a conversion (see the module's docstring)."""
    target = check_options(fmt, shard_size, samples_per_shard)
    src, dest = Path(src).resolve(), Path(dest).resolve()
    classes, loaded = load_splits(src, splits, val_labels, cache)
    for name, _, _ in loaded:
        if dest == src / name or (src / name) in dest.parents:
            raise ConvertError(f"DEST {dest} is inside the source split {src / name}; write the shards elsewhere")
    options = {"shard_size": target, "samples_per_shard": samples_per_shard, "shuffle_seed": shuffle_seed}
    plans = []
    for name, index, labels_file in loaded:
        order = np.arange(len(index)) if shuffle_seed is None else np.random.default_rng(shuffle_seed).permutation(len(index))
        relpaths = [index.relpath(i) for i in order.tolist()]
        labels = index.labels[order].astype(int).tolist()
        keys = sample_keys(relpaths) if fmt == "webdataset" else [""] * len(relpaths)
        sizes = None
        if target is not None:
            overhead = TAR_OVERHEAD if fmt == "webdataset" else 0
            sizes = np.array([os.stat(index.root / p).st_size + overhead for p in relpaths], dtype=np.int64)
        ranges = _cut(sizes if sizes is not None else np.zeros(len(relpaths), np.int64), target, samples_per_shard)
        split = SplitPlan(name, index, labels_file)
        for i, (a, b) in enumerate(ranges):
            split.shards.append(ShardTask(fmt, str(dest), shard_name(fmt, name, i, len(ranges)), str(index.root),
                                          relpaths[a:b], labels[a:b], keys[a:b], classes,
                                          plan_digest(relpaths[a:b], labels[a:b], keys[a:b])))
        plans.append(split)
    return Plan(fmt, src, dest, classes, plans, options)


def _recorded_identity(dest: Path) -> tuple[str, dict] | None:
    """(file, identity) that DEST's manifest or plan records, or None if it holds neither."""
    for path in (dest / MANIFEST, dest / WORK_DIR / PLAN):
        if path.is_file():
            try:
                data = json.loads(path.read_text())
                return str(path), {k: data.get(k) for k in ("format", "classes", "source", "options")}
            except (OSError, ValueError, AttributeError):
                raise ConvertError(f"{path} is not a conversion manifest (unreadable JSON); DEST {dest} is not "
                                   f"this conversion's: choose a new folder") from None
    return None


def _differences(recorded: dict, wanted: dict) -> str:
    shown = []
    for key in ("format", "classes", "options"):
        if recorded.get(key) != wanted[key]:
            shown.append(f"{key} {json.dumps(recorded.get(key))[:120]} (now {json.dumps(wanted[key])[:120]})")
    source, now = recorded.get("source") or {}, wanted["source"]
    if source.get("path") != now["path"]:
        shown.append(f"source {source.get('path')} (now {now['path']})")
    elif source != now:
        shown.append(f"source splits {json.dumps(source.get('splits'))[:200]} (now the tree gives "
                     f"{json.dumps(now['splits'])[:200]})")
    return "; ".join(shown)


def claim_dest(plan: Plan):
    """Check DEST is new, empty or this conversion's (else raise naming what is there), lock it
    against a second conversion, record the plan, remove temporary files of a killed run; return
    per task its manifest entry if already finished (else None), and the lock (an open file)."""
    dest = plan.dest
    if dest.exists() and not dest.is_dir():
        raise ConvertError(f"DEST {dest} is a file, not a folder")
    dest.mkdir(parents=True, exist_ok=True)
    recorded = _recorded_identity(dest)
    if recorded is not None and recorded[1] != plan.identity:
        raise ConvertError(f"DEST {dest} holds another conversion ({recorded[0]}): "
                           f"{_differences(recorded[1], plan.identity)}; choose a new folder or remove it")
    ours = {task.name for task in plan.tasks} | {MANIFEST, WORK_DIR}
    if plan.fmt == "parquet":
        ours.add("data")
    foreign, partials = [], []
    for root, dirs, files in os.walk(dest):
        rel = Path(root).relative_to(dest)
        if rel.parts[:1] == (WORK_DIR,):
            dirs.clear()
            continue
        for name in sorted(dirs) + sorted(files):
            if (rel / name).as_posix() in ours:
                continue
            if name in files and (rel / str(partial_of(name))).as_posix() in ours:
                partials.append(Path(root) / name)  # a shard a killed run was writing
            else:
                foreign.append((rel / name).as_posix())
        dirs[:] = [d for d in dirs if (rel / d).as_posix() in ours]
    if foreign:
        raise ConvertError(f"DEST {dest} holds files that are not this conversion's: {', '.join(foreign[:5])}"
                           f"{f' and {len(foreign) - 5} more' if len(foreign) > 5 else ''}; "
                           f"choose a new or empty folder")
    work = dest / WORK_DIR
    work.mkdir(exist_ok=True)
    lock = open(work / "lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise ConvertError(f"another conversion is writing into DEST {dest} (it holds a lock on {lock.name})") from None
    if not (work / PLAN).is_file():
        atomic_write_text(work / PLAN, json.dumps(plan.identity))
    if plan.fmt == "parquet":
        (dest / "data").mkdir(exist_ok=True)
    for path in partials:
        path.unlink(missing_ok=True)
    if (dest / MANIFEST).is_file():
        manifest = json.loads((dest / MANIFEST).read_text())
        entries = {s["name"]: s for split in manifest["splits"].values() for s in split["shards"]}
        done = []
        for task in plan.tasks:
            entry = entries.get(task.name)
            path = dest / task.name
            done.append(entry if entry and path.is_file() and path.stat().st_size == entry["bytes"] else None)
        return done, lock
    return [finished(task) for task in plan.tasks], lock


@dataclass
class ConvertResult:
    """What a conversion did: the manifest, shards written now and kept from a killed run, seconds."""

    manifest: dict
    written: int
    kept: int
    samples_written: int
    bytes_written: int
    seconds: float


def convert(src: str | Path, dest: str | Path, fmt: str, *, splits: list[str] | tuple[str, ...] = (),
            shard_size: int | str | None = None, samples_per_shard: int | None = None, workers: int = 1,
            val_labels: str | Path | None = None, shuffle_seed: int | None = 0, cache: str | Path | None = None,
            progress: Callable[[dict], None] | None = None) -> ConvertResult:
    """Convert an image tree into shards in DEST (see the module's docstring); ``progress`` is
    called with each shard's manifest entry as it is written."""
    start = time.perf_counter()
    check_options(fmt, shard_size, samples_per_shard, workers)  # before starting processes
    pool = start_pool(workers, ("pyarrow.parquet",) if fmt == "parquet" else ())
    lock = None
    try:
        plan = make_plan(src, dest, fmt, splits, shard_size, samples_per_shard, val_labels, shuffle_seed, cache)
        entries, lock = claim_dest(plan)
        tasks = plan.tasks
        todo = [i for i, entry in enumerate(entries) if entry is None]
        written = {"samples": 0, "bytes": 0}

        def done(position: int, entry: dict) -> None:
            entries[todo[position]] = entry
            written["samples"] += entry["samples"]
            written["bytes"] += entry["bytes"]
            if progress is not None:
                progress(entry)

        run_tasks(write_shard, [tasks[i] for i in todo], pool, done)
        manifest = {"format": plan.fmt, "classes": plan.classes, "splits": {}, "source": plan.source,
                    "options": plan.options, "created_by": f"hvdtrain {__version__} convert"}
        position = 0
        for split in plan.splits:
            shards = entries[position:position + len(split.shards)]
            position += len(split.shards)
            manifest["splits"][split.name] = {"shards": shards, "samples": sum(s["samples"] for s in shards)}
        if not (plan.dest / MANIFEST).is_file() or todo:
            atomic_write_text(plan.dest / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        shutil.rmtree(plan.dest / WORK_DIR, ignore_errors=True)
        fsync_path(plan.dest)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if lock is not None:
            lock.close()
    return ConvertResult(manifest, len(todo), len(tasks) - len(todo), written["samples"], written["bytes"],
                         time.perf_counter() - start)


__all__ = ["ConvertError", "ConvertResult", "DataError", "Plan", "convert", "check_options", "load_splits", "make_plan",
           "parse_size"]
