"""The output directory of a run: one run at a time (a lock), and what shows that a run used it.

:class:`OutputLock` is an exclusive ``flock`` on ``OUTPUT/.hvdtrain.lock``, taken by rank 0 before
it plans the start and held for the run's life (in elastic mode by whichever worker is rank 0).
A second run into the same directory is refused naming the holder (pid, host, start time, written
into the file once the holder's start is decided). The kernel releases a ``flock`` when its
process dies, so the file a killed run leaves behind never blocks the next one; the holder removes
the file when the run ends (after checking it still names the locked inode, so two runs can never
hold locks on two different files).

:func:`run_files` lists what a run leaves in its output (``config.yaml``, ``metrics.jsonl``,
``checkpoints/``, TensorBoard event files): a run without ``--resume`` into a directory holding any
of them is refused.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path

LOCK_FILE = ".hvdtrain.lock"
# What a run writes into its output (besides the recipe's own files): their presence means "used".
CONFIG_FILE = "config.yaml"  # the run's whole config, written by rank 0 once every rank agreed on the start
RUN_FILES = (CONFIG_FILE, "metrics.jsonl")
RUN_PATTERNS = ("metrics.jsonl.abandoned-*", "events.out.tfevents.*")
CHECKPOINT_DIR = "checkpoints"
# the trackers' run ids and W&B's run files (hvdtrain/observability/trackers): a fresh run that failed
# before its first epoch leaves them, and the next run must start new tracker runs, not continue those
TRACKER_LEFTOVERS = ("trackers.json", "wandb")
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # flock errors of file systems without locks


def run_files(output: Path) -> list[str]:
    """What an earlier run left in ``output`` (names relative to it; ``checkpoints/`` first, with
    the names it holds; empty when there is nothing): a run that is not a resume must not write
    among them."""
    output = Path(output)
    found = []
    checkpoints = output / CHECKPOINT_DIR
    if checkpoints.is_dir():
        names = sorted(p.name for p in checkpoints.iterdir())
        if names:
            found.append(f"{CHECKPOINT_DIR}/ ({describe(names, 3)})")
    found += [name for name in RUN_FILES if (output / name).exists()]
    for pattern in RUN_PATTERNS:
        found += sorted(p.name for p in output.glob(pattern))
    return found


def discard_unfinished(output: Path) -> list[str]:
    """After a fresh run (its output held no run when it started) failed before it finished an
    epoch or wrote a checkpoint: remove what it wrote (``config.yaml``, event files, half-written
    ``checkpoints/.tmp-*``, the trackers' run ids), so that the next run is not refused as a reuse
    and opens tracker runs of its own. Returns the names
    removed; nothing when ``metrics.jsonl`` or a checkpoint exists (that run can be resumed)."""
    output = Path(output)
    checkpoints = output / CHECKPOINT_DIR
    kept = checkpoints.is_dir() and any(not p.name.startswith(".tmp-") for p in checkpoints.iterdir())
    if (output / "metrics.jsonl").exists() or kept:
        return []
    removed = []
    leftovers = [output / name for name in TRACKER_LEFTOVERS if (output / name).exists()]
    for path in [output / "config.yaml", *output.glob("events.out.tfevents.*"), *leftovers,
                 *(checkpoints.glob(".tmp-*") if checkpoints.is_dir() else [])]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(str(path.relative_to(output)))
    return removed


def describe(names: list[str], most: int = 4) -> str:
    """``names`` as a short comma-separated list ("a, b, c and 5 more")."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


class OutputLock:
    """An exclusive, non-blocking ``flock`` on ``output/.hvdtrain.lock`` (see the module docstring)."""

    def __init__(self, output: Path):
        self.path = Path(output) / LOCK_FILE
        self.fd: int | None = None
        self.created = False
        self.warning: str | None = None  # set when the file system cannot lock

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self.fd is not None

    def acquire(self) -> str | None:
        """Take the lock; returns None, or why not (another run holds it: named) without waiting."""
        if self.held:
            return None
        while True:
            existed = self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in UNSUPPORTED:  # a file system without locks: go on, unprotected, and say so
                    self.fd, self.created = fd, not existed
                    self.warning = (f"the file system of {self.path.parent} does not support locks ({exc.strerror}): "
                                    f"a second run into it at the same time would not be detected")
                    return None
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                return (f"output directory {self.path.parent} is in use by another run ({self.holder()}, "
                        f"lock file {self.path}); wait for it to end or choose another --output "
                        f"(nothing was changed)")
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a file its holder removed between our open and our lock: ours now
                self.fd, self.created = fd, not existed
                return None
            os.close(fd)

    def holder(self) -> str:
        """Who holds the lock, as its file says ("pid 12 on host h since ..."), or what is known."""
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        if not info.get("pid"):
            return "an hvdtrain run that is starting"
        return f"pid {info['pid']} on host {info.get('host', '?')}, started {info.get('started', '?')}"

    def announce(self) -> None:
        """Write this process's pid, host and time into the lock file (once the run goes ahead)."""
        if not self.held:
            return
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        data = (json.dumps(info) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self, remove: bool = True) -> None:
        """Let the lock go; ``remove``: delete the lock file first (while still holding it). A
        refusal passes ``remove=self.created`` so that a refused run leaves the directory as it was."""
        if not self.held:
            return
        fd, self.fd = self.fd, None
        try:
            if remove:
                try:
                    if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                        self.path.unlink()
                except FileNotFoundError:
                    pass
        finally:
            os.close(fd)  # closing the only descriptor releases the flock
