"""Durable writes: what a crash or power loss cannot leave half-done once these return.

Used by everything that publishes files others read later: checkpoints, the image index, the
token cache, ``config.yaml``, ``metrics.jsonl`` and the exported models. Imports nothing from hvdtrain.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable


def fsync_path(path: str | Path) -> None:
    """Flush ``path`` (a file, or a folder: its entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, fsync it, rename it over
    ``path`` and fsync the folder: readers see the old content or the new, never a part."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and folder under ``root`` (and ``root`` itself), deepest first."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def publish_folder(target: str | Path, fill: Callable[[Path], None]) -> Path:
    """Write the folder ``target`` atomically: ``fill(tmp)`` writes into ``.tmp-NAME-PID`` beside it,
    every file and folder is fsynced, an existing ``target`` is moved aside, the new one renamed
    into place, the parent fsynced and the old one deleted. If anything fails (a full disk inside
    ``fill``), the temporary folder is removed, ``target`` is as it was, and the error is raised."""
    target = Path(target)
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    old = target.with_name(f".trash-{target.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        fill(tmp)
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if target.exists():
        os.rename(target, old)
    os.rename(tmp, target)
    fsync_path(target.parent)
    shutil.rmtree(old, ignore_errors=True)
    return target
