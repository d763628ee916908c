"""A per-host cache entry built once: a file lock, a second look under it, and the builder's result.

The caches of the data layer and the recipes (the image index, the BERT token cache, the embedded
MNIST tree) are each read by every worker of a host and built by the first one to need them:
:func:`build_once` looks for the entry; if it is missing, it takes an exclusive ``flock`` on the
entry's lock file (one builder per host; the others wait on the lock), looks again (another process
may have built it meanwhile) and only then builds. What ``build`` writes must appear whole or not at
all (written beside the entry and renamed into place), so that a reader never sees half of it and a
builder killed half-way leaves only a temporary folder that the next builder clears. ``flock``
locks are dropped by the kernel when their holder dies, so a killed builder never blocks the others.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


@contextmanager
def file_lock(path: str | Path, shared: bool = False) -> Iterator[None]:
    """An exclusive (or ``shared``) ``flock`` on ``path`` for the block; the file and its folder
    are created if missing (the file's content is never read)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(lock: str | Path, find: Callable[[], T | None], build: Callable[[], object],
               look_first: bool = True) -> tuple[T, bool]:
    """``(entry, built)``: what ``find()`` returns (None: not there), built by ``build()`` first if
    missing, once per host (under an exclusive lock on ``lock``; the processes that wait on it
    then find the builder's result). ``look_first=False`` looks only under the lock (a ``find``
    that may repair or clear a damaged entry must not run beside a builder). An entry that
    ``find`` cannot see right after ``build`` is an OSError naming the lock's folder."""
    if look_first:
        found = find()
        if found is not None:
            return found, False
    with file_lock(lock):
        found = find()
        if found is not None:
            return found, False
        build()
        found = find()
    if found is None:
        raise OSError(f"the cache entry built beside {lock} cannot be read back (a cache folder another host "
                      f"rewrote meanwhile?)")
    return found, True
