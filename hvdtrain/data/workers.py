"""Decoding worker processes that write uint8 pixels into shared memory.

The trainer starts the pool (``spawn``: no forked copy of a framework's threads) from its main
thread. Each worker has its own task queue; a task is a small message (which samples, which
shared-memory buffer, where in it); the pixels never travel through a pipe. A worker that fails
to decode a file reports the file and its traceback, and the trainer raises a
:class:`~hvdtrain.data.index.DataError` naming it.

Workers never outlive the trainer: on Linux each asks the kernel for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), and every worker also polls its parent's pid once a second (other
systems, or a parent that died before the request took effect). A normal exit stops them
through :meth:`WorkerPool.close` (also registered with ``atexit``).

Shared-memory segments are named ``hvdtrain-<pid namespace>-<pid>-<start time>-<random>`` after
the trainer that creates them. A trainer killed together with Python's resource tracker (a
process-group kill, as Slurm does) leaves its segment in ``/dev/shm``; the next pool started on
the host removes every such segment whose owner is gone (same pid namespace, and no live process
with that pid and start time), never one of a live trainer (:func:`remove_dead_segments`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing as mp
import os
import queue
import secrets
import signal
import sys
import threading
import time
import traceback
from multiprocessing import shared_memory
from typing import Any

import numpy as np

PR_SET_PDEATHSIG = 1
SEGMENT_PREFIX = "hvdtrain-"
SHM_DIR = "/dev/shm"


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


def segment_name() -> str:
    """A new segment's name, naming this process as its owner (see the module docstring)."""
    pid = os.getpid()
    return f"{SEGMENT_PREFIX}{_pid_namespace()}-{pid}-{_start_time(pid) or 0}-{secrets.token_hex(4)}"


def remove_dead_segments(directory: str = SHM_DIR) -> list[str]:
    """Unlink the shared-memory segments this module named whose owner is gone (killed with its
    resource tracker); returns their names. Segments of another pid namespace, of a live owner, or
    of another user are left alone."""
    removed = []
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
            if _start_time(int(parts[1])) == parts[2]:
                continue  # its owner is alive
            os.unlink(path)
            removed.append(name)
        except OSError:
            continue
    return removed



@contextlib.contextmanager
def _main_not_reimported():
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

class WorkerDied(RuntimeError):
    """A data worker process ended unexpectedly (killed, out of memory)."""


def _die_with_parent(parent_pid: int) -> None:
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


def _attach(name: str, cache: dict[str, shared_memory.SharedMemory]) -> shared_memory.SharedMemory:
    shm = cache.get(name)
    if shm is None:
        # Attaching registers the name with the resource tracker the trainer shares with its
        # workers (spawn passes it on); the tracker keeps a set, so the trainer's own unlink
        # stays the only one, and after a SIGKILL of the trainer the tracker removes the segment.
        shm = shared_memory.SharedMemory(name=name)
        cache[name] = shm
    return shm


# Signals a scheduler or a terminal sends to every process of a job (Slurm signals all processes of
# a step: --signal=USR1@N, SIGTERM on preemption or requeue; Ctrl-C reaches the process group). The
# trainer decides what they mean (a checkpoint, then exit); a worker that died of one would take its
# batches with it. Workers ignore them and end with the trainer (_die_with_parent).
JOB_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")
                    if hasattr(signal, name))


def worker_main(parent_pid: int, tasks: Any, results: Any) -> None:
    """A worker's loop: ``("source", id, source)`` registers a source (an object with
    ``fill(out, positions, samples, epoch) -> list of substitutions``); ``("work", batch, chunk,
    source, shm_name, shape, positions, samples, epoch)`` fills part of a batch; ``None`` stops."""
    for number in JOB_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    sources: dict[int, Any] = {}
    segments: dict[str, shared_memory.SharedMemory] = {}
    while True:
        message = tasks.get()
        if message is None:
            break
        if message[0] == "source":
            sources[message[1]] = message[2]
            continue
        _, batch, chunk, source, shm_name, shape, positions, samples, epoch = message
        try:
            shm = _attach(shm_name, segments)
            out = np.ndarray(shape, dtype=np.uint8, buffer=shm.buf)
            substituted = sources[source].fill(out, positions, samples, epoch)
            results.put((batch, chunk, None, substituted))
        except BaseException as exc:  # noqa: BLE001  (reported to the trainer, which raises it)
            results.put((batch, chunk, (type(exc).__name__, str(exc), traceback.format_exc()), []))
    for shm in segments.values():
        shm.close()


class WorkerPool:
    """``num_workers`` decoding processes and one shared-memory batch buffer (grown on demand).

    :meth:`run` fills one batch: it splits the samples into one chunk per worker, waits for all
    of them and returns a copy of the pixels (so the buffer is free for the next batch at once).
    """

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        remove_dead_segments()  # what trainers killed with their resource tracker left on this host
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(num_workers)]
        self.procs = [ctx.Process(target=worker_main, args=(os.getpid(), q, self.results), daemon=True,
                                  name=f"hvdtrain-data-{i}") for i, q in enumerate(self.tasks)]
        with _main_not_reimported():
            for p in self.procs:
                p.start()
        self.shm: shared_memory.SharedMemory | None = None
        self._sources = 0
        self._batch = 0
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers."""
        return [p.pid for p in self.procs]

    def add_source(self, source: Any) -> int:
        """Send ``source`` (picklable, with a ``fill`` method) to every worker once; return its id."""
        with self._lock:
            sid = self._sources
            self._sources += 1
            for q in self.tasks:
                q.put(("source", sid, source))
            return sid

    def _buffer(self, nbytes: int) -> shared_memory.SharedMemory:
        if self.shm is None or self.shm.size < nbytes:
            if self.shm is not None:
                self.shm.close()
                self.shm.unlink()
            self.shm = shared_memory.SharedMemory(name=segment_name(), create=True, size=max(nbytes, 1))
        return self.shm

    def run(self, source: int, shape: tuple[int, ...], samples: np.ndarray, epoch: int) -> tuple[np.ndarray, list]:
        """The uint8 batch of ``shape`` whose row ``i`` is sample ``samples[i]`` of ``source``, and
        the substitutions made (``skip`` of unreadable files)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the data worker pool is closed")
            self._batch += 1
            batch = self._batch
            shm = self._buffer(int(np.prod(shape)))
            chunks = [c for c in np.array_split(np.arange(len(samples)), self.num_workers) if len(c)]
            for k, positions in enumerate(chunks):
                self.tasks[k % self.num_workers].put(("work", batch, k, source, shm.name, shape, positions,
                                                      samples[positions], epoch))
            pending, substituted, failure = set(range(len(chunks))), [], None
            while pending:
                try:
                    got, chunk, error, subs = self.results.get(timeout=1.0)
                except queue.Empty:
                    dead = [p for p in self.procs if not p.is_alive()]
                    if dead:
                        self._closed = True
                        raise WorkerDied(f"data worker {dead[0].name} (pid {dead[0].pid}) ended with exit code "
                                         f"{dead[0].exitcode} while decoding a batch") from None
                    continue
                if got != batch:
                    continue  # left over from a batch that failed earlier
                pending.discard(chunk)
                substituted += subs
                if error is not None and failure is None:
                    failure = error
            if failure is not None:
                from hvdtrain.data.index import DataError

                kind, message, trace = failure
                if kind == "DataError":
                    raise DataError(message)
                raise RuntimeError(f"data worker failed: {kind}: {message}\n--- worker traceback ---\n{trace}")
            out = np.ndarray(shape, dtype=np.uint8, buffer=shm.buf).copy()
            return out, substituted

    def close(self) -> None:
        """Stop the workers and free the shared memory (idempotent)."""
        if self._closed and not any(p.is_alive() for p in self.procs) and self.shm is None:
            return
        self._closed = True
        for q in self.tasks:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=1.0)
        if self.shm is not None:
            try:
                self.shm.close()
                self.shm.unlink()
            except (OSError, FileNotFoundError):
                pass
            self.shm = None
