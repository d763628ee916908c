"""Helper processes of a trainer that never outlive it, and the shared memory they write into.

Used by the image pipeline's decoding workers (:mod:`hvdtrain.data.workers`), the data converter's
pool and the map-style sources' item workers (:mod:`hvdtrain.core.item_workers`). Workers are
started with ``spawn`` (no forked copy of a framework's threads) while the trainer's ``__main__`` is
hidden (:func:`main_not_reimported`), ignore the signals a scheduler sends a whole job
(:data:`JOB_SIGNALS`) and end with the trainer (:func:`die_with_parent`).

Shared-memory segments are named ``hvdtrain-<pid namespace>-<pid>-<start time>-<random>`` after
the trainer that creates them (:func:`segment_name`). A trainer killed together with Python's
resource tracker (a process-group kill, as Slurm does) leaves its segments in ``/dev/shm``; the next
pool started on the host removes every such segment whose owner is gone (same pid namespace, and no
live process with that pid and start time), never one of a live trainer (:func:`remove_dead_segments`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1
SEGMENT_PREFIX = "hvdtrain-"
SHM_DIR = "/dev/shm"

# Signals a scheduler or a terminal sends to every process of a job (Slurm signals all processes of
# a step: --signal=USR1@N, SIGTERM on preemption or requeue; Ctrl-C reaches the process group). The
# trainer decides what they mean (a checkpoint, then exit); a worker that died of one would take its
# batches with it. Workers ignore them and end with the trainer (die_with_parent).
JOB_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")
                    if hasattr(signal, name))


def _pid_namespace() -> str:
    """This process's pid namespace (an inode number), or "0" where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        return "0"


def _start_time(pid: int) -> str | None:
    """Process ``pid``'s start time in clock ticks since boot (/proc), "0" where /proc is missing
    but the process exists, None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        pass
    if os.path.isdir("/proc/self"):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "0"


def owner_tag() -> str:
    """``<pid namespace>-<pid>-<start time>`` of this process: what names it as the owner of a
    segment or a folder it leaves behind if killed (:func:`owner_gone` reads it back)."""
    pid = os.getpid()
    return f"{_pid_namespace()}-{pid}-{_start_time(pid) or 0}"


def owner_gone(namespace: str, pid: str, start: str) -> bool:
    """Whether the owner named by an :func:`owner_tag` (its three parts) is gone: true only for an
    owner of this pid namespace (a pid of another namespace, e.g. another container with the same
    host name, says nothing here) with no live process of that pid and start time."""
    return namespace == _pid_namespace() and pid.isdigit() and _start_time(int(pid)) != start


def segment_name() -> str:
    """A new segment's name, naming this process as its owner (see the module docstring)."""
    return f"{SEGMENT_PREFIX}{owner_tag()}-{secrets.token_hex(4)}"


def remove_dead_segments(directory: str = SHM_DIR) -> list[str]:
    """Unlink the shared-memory segments this module named whose owner is gone (killed with its
    resource tracker); returns their names. Segments of another pid namespace, of a live owner, or
    of another user are left alone."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    namespace, uid = _pid_namespace(), os.getuid()
    for name in names:
        parts = name[len(SEGMENT_PREFIX):].split("-") if name.startswith(SEGMENT_PREFIX) else []
        if len(parts) != 4 or parts[0] != namespace or not parts[1].isdigit():
            continue
        path = os.path.join(directory, name)
        try:
            if os.stat(path).st_uid != uid:
                continue
            if not owner_gone(*parts[:3]):
                continue  # its owner is alive
            os.unlink(path)
            removed.append(name)
        except OSError:
            continue
    return removed


@contextlib.contextmanager
def main_not_reimported():
    """While workers start: hide the trainer's ``__main__`` from ``spawn``, which would otherwise
    re-run the user's script in every worker (a script without an ``if __name__ == "__main__":``
    guard would start a second training there and fail). Workers need only this package."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        if "__file__" in saved:
            del main.__dict__["__file__"]
        if "__spec__" in saved:
            main.__dict__["__spec__"] = None  # spawn reads it: None means "no module to import"
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def die_with_parent(parent_pid: int) -> None:
    """Exit when the parent does: kernel SIGKILL on Linux, and a polling thread everywhere."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except OSError:
            pass
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="hvdtrain-parent-watch", daemon=True).start()


def ignore_job_signals() -> None:
    """In a worker: leave the job's signals to the trainer (see :data:`JOB_SIGNALS`)."""
    for number in JOB_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


def stop_workers(tasks: list[Any], procs: list[Any]) -> None:
    """Ask each worker to end (``None`` on its task queue), wait 2 s for it, then kill one that
    is still alive: the end of every helper-process pool."""
    for q in tasks:
        try:
            q.put(None)
        except (OSError, ValueError):  # a queue already closed
            pass
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=1.0)
