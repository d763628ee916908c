"""Map-style sources read in worker processes: ``__getitem__`` and collation off the trainer's process.

A source :func:`hvdtrain.core.sources.as_source` made from a map-style dataset (a torch ``Dataset``)
or a Hugging Face ``datasets.Dataset`` (``in_workers = True``) is read by ``data.workers``
processes per rank, the way torch's ``DataLoader`` reads with ``num_workers``: each batch is
fetched and collated whole by one worker (batch ``k`` by worker ``k mod W``), ``W +
data.prefetch_batches`` batches are in flight, and the batches come back in their order. So the
samples, their order and the collated arrays are the ones the trainer's own thread reads
(``data.workers=0``): resume and bitwise results do not depend on the number of workers.

* Workers are spawned, not forked (the trainer holds Horovod's and the framework's threads), with
  the trainer's ``__main__`` hidden (the user's script is not re-run), once per process and worker
  count (:func:`pool`): the training and validation data, and every run in one process, share them.
  Each source travels to them once, pickled with cloudpickle (a ``Dataset`` class defined in the
  script travels by value), and is forgotten when it is garbage collected. A source that cannot be
  pickled, or that a worker cannot load, is read by the loop's prefetch thread instead, with one
  warning line naming why (:func:`batches`).
* Before each item a worker seeds Python's, NumPy's and (once imported) torch's global random
  generators from ``(train.seed, epoch, index)``: random augmentation in ``__getitem__`` gives a
  sample the same draw at any world size, with any number of workers, and after a resume (torch's
  ``DataLoader`` seeds each worker once, base seed + worker id).
* A collated batch travels through a shared-memory slot of the trainer (pickle protocol 5, the
  arrays out of band: one copy into the slot, one out); a batch larger than the slot travels
  through the pipe. Slots are as large as the largest of the last :data:`SLOT_WINDOW` batches that
  is not an outlier (more than :data:`SLOT_OUTLIER` times their median): a batch of ordinary size
  that outgrows the slots makes the next ones larger, one outlier (a 2 GB item) travels through the
  pipe and no slot is made, or kept, at its size (before, every slot grew to it for the rest of the
  pass: ``W + prefetch`` times its size held per rank).
* An item whose ``__getitem__`` raises is named (:class:`~hvdtrain.core.sources.ItemError`,
  ``TrainTask.train_data[1234]: ...`` with the worker's traceback), raised at that batch's
  position; a worker that dies is named with its exit code (:class:`WorkerDied`).
* Workers end with the trainer (:mod:`hvdtrain.core.processes`); :meth:`ItemWorkers.close` stops
  them and unlinks the slots, at exit or when a worker died.
"""

from __future__ import annotations

import atexit
import collections
import importlib.util
import multiprocessing as mp
import os
import pickle
import queue
import random
import sys
import traceback
import weakref
from multiprocessing import shared_memory
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from hvdtrain.core import watchdog
from hvdtrain.core.processes import (die_with_parent, ignore_job_signals, main_not_reimported,
                                     remove_dead_segments, segment_name, stop_workers)
from hvdtrain.core.sources import ItemError

MAX_DEFAULT_WORKERS = 4  # each worker holds a copy of the source (and imports what its items need)
SLOT_ROUND = 1 << 16
SLOT_WINDOW = 64  # the last batches whose sizes set the slots' size
SLOT_OUTLIER = 4  # a batch more than this many times the window's median is an outlier: no slot sized for it
_POOLS: dict[int, "ItemWorkers"] = {}  # this process's pools, by number of workers
_SOURCES: "weakref.WeakKeyDictionary[Any, tuple[ItemWorkers, int, int] | None]" = weakref.WeakKeyDictionary()


class WorkerDied(RuntimeError):
    """An item worker process ended unexpectedly (killed, out of memory)."""


class WorkerStartError(RuntimeError):
    """A worker could not load the source (the reason, one line)."""


def default_workers(local_size: int) -> int:
    """``data.workers=None``: the cores each local rank can have, at most :data:`MAX_DEFAULT_WORKERS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_DEFAULT_WORKERS, cores // max(1, local_size)))


def item_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of item ``index``'s global random generators in ``epoch`` (32 bits)."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, epoch + 1, index]).generate_state(1)[0])


def _seed_item(seed: int, epoch: int, index: int) -> None:
    value = item_seed(seed, epoch, index)
    random.seed(value)
    np.random.seed(value)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(value)


def _load(blob: bytes, seed: int) -> Any:
    """A source as a worker holds it: unpickled, its items seeded from ``(seed, epoch, index)``."""
    source = pickle.loads(blob)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    source.before_item = lambda epoch, index: _seed_item(seed, epoch, index)
    return source


def _read(source: Any, indices: np.ndarray, epoch: int, slot: str | None, size: int,
          segments: collections.OrderedDict) -> tuple[bytes, list[int] | None, int]:
    """One batch of ``source``, pickled with its arrays in shared-memory slot ``slot`` (in the pickle
    itself when there is no slot or the batch does not fit): ``(pickled, sizes, bytes needed)``."""
    batch = source.get_batch(indices, epoch)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    need = sum(r.nbytes for r in raws)
    if slot is None or need > size:
        return pickle.dumps(batch, protocol=5), None, need
    shm = _attach(slot, segments)
    offset = 0
    for raw in raws:
        shm.buf[offset:offset + raw.nbytes] = raw
        offset += raw.nbytes
    return data, [r.nbytes for r in raws], need


def worker_main(parent_pid: int, worker: int, tasks: Any, results: Any) -> None:
    """A worker: ``("source", sid, blob, seed)`` loads a source (answering ``("loaded", sid, worker,
    why)``, ``why`` None when it loaded), ``("drop", sid)`` forgets it, ``(key, sid, indices, epoch,
    slot, size)`` reads a batch (``("batch", key, pickled, sizes, need)`` or ``("error", key,
    message)``); ``None`` stops."""
    ignore_job_signals()
    die_with_parent(parent_pid)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    sources: dict[int, Any] = {}
    segments: collections.OrderedDict[str, shared_memory.SharedMemory] = collections.OrderedDict()
    while True:
        message = tasks.get()
        if message is None:
            break
        if message[0] == "source":
            try:
                sources[message[1]] = _load(message[2], message[3])
                results.put(("loaded", message[1], worker, None))
            except BaseException as exc:  # noqa: BLE001  (the trainer falls back to its thread, naming it)
                results.put(("loaded", message[1], worker, f"{type(exc).__name__}: {exc}"))
            continue
        if message[0] == "drop":
            sources.pop(message[1], None)
            continue
        key, sid, indices, epoch, slot, size = message
        source = sources[sid]
        try:
            results.put(("batch", key, *_read(source, indices, epoch, slot, size, segments)))
        except ItemError as exc:
            results.put(("error", key, f"{exc} (data worker {worker}, pid {os.getpid()})\n--- worker traceback ---\n"
                                       f"{traceback.format_exc()}"))
        except BaseException as exc:  # noqa: BLE001  (raised by the trainer at this batch's position)
            first = f" (indices {int(indices[0])}..{int(indices[-1])})" if len(indices) else ""
            results.put(("error", key, f"TrainTask.{getattr(source, 'field', 'data')}: reading a batch of "
                                       f"{len(indices)} items{first} raised {type(exc).__name__}: {exc} (data worker "
                                       f"{worker}, pid {os.getpid()})\n--- worker traceback ---\n"
                                       f"{traceback.format_exc()}"))
    for shm in segments.values():
        shm.close()


def _attach(name: str, cache: collections.OrderedDict) -> shared_memory.SharedMemory:
    """The trainer's slot ``name``, mapped once (the few last ones are kept; slots are replaced when
    they grow). Attaching registers the name with the resource tracker the trainer shares with its
    workers (spawn passes it on): the trainer's unlink stays the only one."""
    shm = cache.pop(name, None) or shared_memory.SharedMemory(name=name)
    cache[name] = shm
    while len(cache) > 16:
        cache.popitem(last=False)[1].close()
    return shm


class ItemWorkers:
    """``num_workers`` processes reading the sources :meth:`add` gives them (one pool per process and
    worker count: the training and validation data, and every run in the process, share it);
    :meth:`batches` yields a source's batches in order."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._closed = False
        self._free: list[shared_memory.SharedMemory] = []
        self._pending: dict[tuple[int, int], shared_memory.SharedMemory | None] = {}
        self._arrived: dict[tuple[int, int], tuple[Any, shared_memory.SharedMemory | None]] = {}
        self._loads: dict[int, dict[int, str | None]] = {}
        self._live: set[int] = set()
        self._generation, self._sources = 0, 0
        self._sizes: collections.deque[int] = collections.deque(maxlen=SLOT_WINDOW)  # recent batches' bytes
        remove_dead_segments()  # what trainers killed with their resource tracker left on this host
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(num_workers)]
        self.procs = [ctx.Process(target=worker_main, args=(os.getpid(), i, q, self.results),
                                  daemon=True, name=f"hvdtrain-items-{i}") for i, q in enumerate(self.tasks)]
        with main_not_reimported():
            for p in self.procs:
                p.start()
        atexit.register(self.close)

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers."""
        return [p.pid for p in self.procs]

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or a worker died)."""
        return self._closed

    def add(self, blob: bytes, seed: int, field: str) -> int:
        """Send a pickled source to every worker; its id, or :class:`WorkerStartError` with the reason
        a worker could not load it."""
        sid = self._sources = self._sources + 1
        self._loads[sid] = {}
        for q in self.tasks:
            q.put(("source", sid, blob, seed))
        while len(self._loads[sid]) < self.num_workers:
            self._receive(field)
        why = next((w for w in self._loads.pop(sid).values() if w), None)
        if why:
            self.drop(sid)
            raise WorkerStartError(why)
        return sid

    def drop(self, sid: int) -> None:
        """The workers forget source ``sid`` (it was garbage collected)."""
        if not self._closed:
            for q in self.tasks:
                try:
                    q.put(("drop", sid))
                except (OSError, ValueError):
                    pass

    def _get(self, field: str) -> Any:
        """The next message from any worker; :class:`WorkerDied` naming a worker that ended."""
        while True:
            try:
                return self.results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in self.procs if not p.is_alive()]
                if dead:
                    self.close()
                    raise WorkerDied(f"TrainTask.{field}: data worker {dead[0].name} (pid {dead[0].pid}) ended "
                                     f"with exit code {dead[0].exitcode} while reading items") from None

    def slot_size(self) -> int:
        """The bytes a slot is made with now: the largest of the recent batches (:data:`SLOT_WINDOW`)
        that is at most :data:`SLOT_OUTLIER` times their median, rounded up (0 before the first)."""
        if not self._sizes:
            return 0
        ordered = sorted(self._sizes)
        median = ordered[(len(ordered) - 1) // 2]
        typical = max(n for n in ordered if n <= SLOT_OUTLIER * median)
        return -(-typical // SLOT_ROUND) * SLOT_ROUND

    def _slot(self) -> shared_memory.SharedMemory | None:
        """A free slot of :meth:`slot_size` (one that is smaller, or more than :data:`SLOT_OUTLIER`
        times larger, is replaced); None before the first batch arrived."""
        slot = self._free.pop() if self._free else None
        size = self.slot_size()
        if size and (slot is None or slot.size < size or slot.size > SLOT_OUTLIER * size):
            if slot is not None:
                self._unlink(slot)
            slot = shared_memory.SharedMemory(name=segment_name(), create=True, size=size)
        return slot

    def _release(self, slot: shared_memory.SharedMemory | None) -> None:
        """A slot back from a batch: kept for the next one, or unlinked when it is more than
        :data:`SLOT_OUTLIER` times :meth:`slot_size` (the memory of an outlier is not held)."""
        if slot is None:
            return
        size = self.slot_size()
        if size and slot.size > SLOT_OUTLIER * size:
            self._unlink(slot)
        else:
            self._free.append(slot)

    @staticmethod
    def _unlink(slot: shared_memory.SharedMemory) -> None:
        try:
            slot.close()
            slot.unlink()
        except (OSError, BufferError):
            pass

    def _receive(self, field: str) -> None:
        message = self._get(field)
        if message[0] == "loaded":
            self._loads.setdefault(message[1], {})[message[2]] = message[3]
            return
        key = message[1]
        slot = self._pending.pop(key, None)
        if message[0] == "batch":
            self._sizes.append(message[4])
        if key[0] in self._live:
            self._arrived[key] = (message, slot)
        else:
            self._release(slot)  # a batch of an iteration that was left early

    def _take(self, key: tuple[int, int], field: str) -> Any:
        while key not in self._arrived:
            self._receive(field)
        message, slot = self._arrived.pop(key)
        try:
            if message[0] == "error":
                raise ItemError(message[2])
            _, _, data, sizes, _ = message
            if sizes is None:
                return pickle.loads(data)
            views, offset = [], 0
            for n in sizes:
                views.append(bytearray(slot.buf[offset:offset + n]))  # a copy: the slot is reused at once
                offset += n
            return pickle.loads(data, buffers=views)
        finally:
            self._release(slot)

    def batches(self, sid: int, index_lists: Iterable[np.ndarray], epoch: int, depth: int,
                field: str = "data") -> Iterator[Any]:
        """``get_batch(indices, epoch)`` of source ``sid`` for each of ``index_lists``, in their order,
        read by the workers up to ``num_workers + depth`` batches ahead."""
        lists = list(index_lists)
        self._generation += 1
        generation, ahead = self._generation, self.num_workers + max(0, depth)
        self._live.add(generation)
        sent = done = 0
        try:
            while done < len(lists):
                if self._closed:
                    raise RuntimeError(f"TrainTask.{field}: the data workers are closed")
                while sent < len(lists) and sent - done < ahead:
                    slot = self._slot()
                    key = (generation, sent)
                    self._pending[key] = slot
                    self.tasks[sent % self.num_workers].put((key, sid, np.asarray(lists[sent]), epoch,
                                                             slot.name if slot else None, slot.size if slot else 0))
                    sent += 1
                yield self._take((generation, done), field)
                done += 1
        finally:
            self._live.discard(generation)
            for key in [k for k in self._arrived if k[0] == generation]:
                self._release(self._arrived.pop(key)[1])

    def close(self) -> None:
        """Stop the workers and unlink every slot (idempotent)."""
        if self._closed:
            return
        self._closed = True
        stop_workers(self.tasks, self.procs)
        slots = self._free + list(self._pending.values()) + [slot for _, slot in self._arrived.values()]
        for slot in slots:
            if slot is not None:
                self._unlink(slot)
        self._free, self._pending, self._arrived = [], {}, {}
        for q in [self.results, *self.tasks]:
            q.cancel_join_thread()
            q.close()


def _by_value_where_unimportable(source: Any, cloudpickle: Any) -> None:
    """Have cloudpickle send the dataset's classes by value where a worker could not import their
    module by name (a module loaded from a file path): ``__main__``'s already travel by value."""
    for cls in type(getattr(source, "source", source)).__mro__:
        name = cls.__module__
        if name in ("__main__", "builtins") or name not in sys.modules:
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            cloudpickle.register_pickle_by_value(sys.modules[name])


def pool(workers: int) -> ItemWorkers:
    """This process's pool of ``workers`` processes (started now, from the calling thread, if needed)."""
    found = _POOLS.get(workers)
    if found is None or found.closed:
        found = _POOLS[workers] = ItemWorkers(workers)
    return found


def batches(source: Any, index_lists: list[np.ndarray], epoch: int, depth: int, workers: int, seed: int,
            say: Callable[[str, bool], None]) -> Iterator[Any] | None:
    """``source``'s batches read by ``workers`` processes, or None where the loop's thread reads
    them: ``workers == 0``, or a source that cannot go to a worker. ``say(line, warning)`` gets one
    line, once per source: how it is read, or the warning naming why not. The source is sent to the
    workers once and forgotten when it is garbage collected."""
    if workers <= 0 or _SOURCES.get(source, ...) is None:
        return None
    with watchdog.phase("starting the data workers"):
        workers_pool = pool(workers)
    known = _SOURCES.get(source)
    if known is None or known[0] is not workers_pool or known[2] != seed:
        field = getattr(source, "field", "data")
        what = f"TrainTask.{field}: {type(getattr(source, 'source', source)).__name__}"
        try:
            import cloudpickle

            _by_value_where_unimportable(source, cloudpickle)
            with watchdog.phase(f"sending TrainTask.{field} to the data workers"):
                sid = workers_pool.add(cloudpickle.dumps(source), seed, field)
        except (WorkerDied, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001  (named in the warning; the thread reads the items as before)
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            where = "a worker could not load it" if isinstance(exc, WorkerStartError) else "it cannot be pickled"
            say(f"{what} is read by the loop's thread, not in data worker processes: {where} ({why}); "
                f"data.workers=0 reads it there without this line", True)
            _SOURCES[source] = None
            return None
        weakref.finalize(source, workers_pool.drop, sid)
        say(f"data: {what} read by {workers} worker process(es) per rank (data.workers)", False)
        known = _SOURCES[source] = (workers_pool, sid, seed)
    return workers_pool.batches(known[1], index_lists, epoch, depth, getattr(source, "field", "data"))
