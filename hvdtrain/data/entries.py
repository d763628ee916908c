"""A per-host cache of immutable index entries (NumPy arrays + ``meta.json``), built once under a lock.

The cache lives under ``$HVDTRAIN_DATA_CACHE/index`` (default ``~/.cache/hvdtrain/data/index``):
one *slot* folder per data source (an image split folder, or a list of shards) holding
``current.json`` and one entry folder per built content, named by the SHA-256 of that content.
``current.json`` points at an entry and is valid while the source's *key* (a fingerprint of
modification times and sizes, computed by the caller) is the one recorded. The first process on a
host to need it builds it under a file lock; the others wait, then memory-map the same arrays
(shared page cache, no copy). An entry never changes once published (files and folders are fsynced
before the rename that publishes them) and is deleted only when no live process holds it (each holds
a shared lock on the entry while it lives), so decoding workers that open it lazily by path read
the index their dataset was built from, even after the data changed and a new entry was built.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from hvdtrain.core.durable import atomic_write_text, fsync_path
from hvdtrain.data.build_once import build_once

POINTER = "current.json"
IN_USE = ".in-use"
_HELD: dict[str, object] = {}  # entry folder -> open file holding its shared lock (for this process's life)


@atexit.register
def _release_held() -> None:
    """Close the held locks at exit (the OS would drop them anyway; this keeps interpreters quiet)."""
    while _HELD:
        _HELD.popitem()[1].close()


def cache_root() -> Path:
    """Where indexes are cached."""
    base = Path(os.environ.get("HVDTRAIN_DATA_CACHE", Path.home() / ".cache" / "hvdtrain" / "data"))
    return base / "index"


def slot_path(base: str | Path | None, identity: bytes, label: str) -> Path:
    """The slot folder of a data source identified by ``identity`` (e.g. its absolute path),
    readable by ``label``, under ``base`` (None: :func:`cache_root`)."""
    base = Path(base) if base else cache_root()
    return base / (hashlib.sha1(identity).hexdigest()[:16] + "-" + label)


def _write_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


def _publish(slot: Path, key: str, arrays: dict[str, np.ndarray], meta: dict) -> str:
    """Publish an entry of ``arrays`` and ``meta`` in ``slot`` (unless one with the same content
    exists), point ``current.json`` at it; return the entry's name. ``meta["root"]`` is left out
    of the content's digest (two copies of the same data are the same data)."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(arrays[name]).tobytes())
    digest.update(json.dumps({k: v for k, v in meta.items() if k != "root"}, sort_keys=True).encode())
    name = digest.hexdigest()
    entry = slot / name
    slot.mkdir(parents=True, exist_ok=True)
    if not (entry / "meta.json").is_file():
        tmp = slot / f".tmp-{name[:16]}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for array_name, array in arrays.items():
            _write_npy(tmp / f"{array_name}.npy", array)
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


def map_arrays(entry: str | Path, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The entry's arrays ``names`` (those it has), memory-mapped read-only."""
    entry = Path(entry)
    return {name: np.load(entry / f"{name}.npy", mmap_mode="r") for name in names
            if (entry / f"{name}.npy").is_file()}


def _read(slot: Path, key: str, names: tuple[str, ...]) -> tuple[Path, dict, dict[str, np.ndarray]] | None:
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
        arrays = map_arrays(entry, names)
    except (OSError, ValueError):
        return None
    return entry, meta, arrays


def load_entry(slot: Path, key: str, names: tuple[str, ...],
               build: Callable[[], tuple[dict[str, np.ndarray], dict]]) -> tuple[Path, dict, dict[str, np.ndarray], bool]:
    """The current entry of ``slot`` for ``key``: ``(entry folder, meta, arrays, built)``; built
    now by ``build() -> (arrays, meta)`` if missing (once per host: the others wait on the lock)."""
    def publish() -> None:
        arrays, meta = build()
        _publish(slot, key, arrays, meta)

    found, built = build_once(slot.with_name(slot.name + ".lock"), lambda: _read(slot, key, names), publish)
    return (*found, built)
