"""Decoding worker processes that write uint8 pixels into shared memory.

The trainer starts the pool (``spawn``: no forked copy of a framework's threads) from its main
thread. Each worker has its own task queue; a task is a small message (which samples, which
shared-memory buffer, where in it); the pixels never travel through a pipe. A worker that fails
to decode a file reports the file and its traceback, and the trainer raises a
:class:`~hvdtrain.data.index.DataError` naming it.

Workers never outlive the trainer and ignore the job's signals; shared-memory segments are named
after their owner and those of killed trainers are removed at the next start
(:mod:`hvdtrain.core.processes`). A normal exit stops the workers through :meth:`WorkerPool.close`
(also registered with ``atexit``).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import queue
import signal
import threading
import traceback
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from hvdtrain.core.processes import (JOB_SIGNALS, SEGMENT_PREFIX, SHM_DIR, remove_dead_segments,  # noqa: F401
                                     segment_name, stop_workers)
from hvdtrain.core.processes import die_with_parent as _die_with_parent
from hvdtrain.core.processes import main_not_reimported as _main_not_reimported


class WorkerDied(RuntimeError):
    """A data worker process ended unexpectedly (killed, out of memory)."""


def _attach(name: str, cache: dict[str, shared_memory.SharedMemory]) -> shared_memory.SharedMemory:
    shm = cache.get(name)
    if shm is None:
        # Attaching registers the name with the resource tracker the trainer shares with its
        # workers (spawn passes it on); the tracker keeps a set, so the trainer's own unlink
        # stays the only one, and after a SIGKILL of the trainer the tracker removes the segment.
        shm = shared_memory.SharedMemory(name=name)
        cache[name] = shm
    return shm


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
        stop_workers(self.tasks, self.procs)
        if self.shm is not None:
            try:
                self.shm.close()
                self.shm.unlink()
            except (OSError, FileNotFoundError):
                pass
            self.shm = None
