"""Durable writes: what a crash or power loss cannot leave half-done once these return.

Used by everything that publishes files others read later: checkpoints, the image index, the
token cache, ``config.yaml`` and ``metrics.jsonl``. Imports nothing from hvdtrain.
"""

from __future__ import annotations

import os
from pathlib import Path


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
