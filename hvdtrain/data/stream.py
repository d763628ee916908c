"""Streaming mode: each rank reads whole shards in a planned order, a few shards ahead, from a local spool.

Random access to remote shards costs one request per sample; streaming costs one sequential
download per shard. What stays as in random-access mode: which sample a position of the epoch
holds, its pixels (the transform is drawn from ``(seed, epoch, sample)``), its label, and so the
batches, whatever the number of decoding workers, and a resumed run's bitwise equality.

**The plan** (:class:`StreamPlan`), per epoch and drawn from ``(seed, epoch)`` alone: the shards
are put in a random order, each shard's samples in a random order, and this sequence of samples
is cut into ``lanes`` consecutive stretches of equal length (give or take one); position ``p`` of
the epoch holds the ``p // lanes``-th sample of lane ``p % lanes``. The training loop deals
position ``p`` to rank ``p % world_size`` (:mod:`hvdtrain.core.sharding`), so with as many lanes as
ranks each rank reads its own lane: its own shards, one after the other, each sequentially (a
shard cut by a lane boundary is read by both lanes). The dataset sees the loop's sample indices;
it undoes the loop's shuffle (the same ``epoch_order``) to find each index's position, and hands
out the plan's sample there instead: the loop's order is replaced by the plan, position for
position, so the position a checkpoint records (epoch, samples consumed) means the same samples
in a resumed run. Lanes must not change within a run: the recipe fixes them (``image.stream_lanes``,
default the world size at start); another world size after a resume reads every sample exactly as
planned but no longer one lane per rank (each rank then reads from several lanes).

**The spool** (:class:`Spool`): before a batch is decoded, the shards it reads from its lanes'
current places are downloaded whole (or waited for), and the next shards of those lanes are
started, in lane order, while the spool holds at most ``max_shards`` shards and ``max_bytes``
bytes (downloads in flight included); spooled shards outside that window are deleted. A sample
whose shard is not spooled (a shard past the bound, or a re-read such as the padding that evens out
the ranks' batches at an epoch's end) is read by a range request: what is read never depends on
what is spooled. The spool folder is private to the process and removed at exit; one left by a
killed process on this host (same pid namespace, no live process of its pid and start time) is
removed by the next spool created in the same place.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from concurrent.futures import Future

import numpy as np

from hvdtrain.core import processes, sharding
from hvdtrain.data import remote
from hvdtrain.data.errors import DataError
from hvdtrain.data.reader import spool_name

SPOOL_PREFIX = "hvdtrain-spool-"
DOWNLOADERS = 2


class EpochPlan:
    """One epoch's plan: ``order[p]`` is the sample at position ``p``; ``sequence`` the samples
    shard by shard, cut into lanes at ``lane_start``; ``segments``: runs of one shard within one
    lane (``seg_start`` into ``sequence``, ``seg_shard``, ``seg_lane``)."""

    def __init__(self, sequence: np.ndarray, shard_of: np.ndarray, lanes: int):
        n = len(sequence)
        self.lanes, self.sequence = lanes, sequence
        q, rem = divmod(n, lanes)
        lengths = np.full(lanes, q, dtype=np.int64)
        lengths[:rem] += 1
        self.lane_start = np.zeros(lanes + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.lane_start[1:])
        p = np.arange(n, dtype=np.int64)
        self.order = sequence[self.lane_start[p % lanes] + p // lanes]
        shards = shard_of[sequence]
        cut = np.zeros(n, dtype=bool)
        if n:
            cut[0] = True
            cut[1:] = shards[1:] != shards[:-1]
            cut[self.lane_start[:-1][lengths > 0]] = True
        self.seg_start = np.flatnonzero(cut).astype(np.int64)
        self.seg_shard = shards[self.seg_start]
        self.seg_lane = np.searchsorted(self.lane_start, self.seg_start, side="right") - 1

    def segments_of(self, positions: np.ndarray) -> np.ndarray:
        """The segment each position's sample belongs to (positions < the epoch's size)."""
        lane, k = positions % self.lanes, positions // self.lanes
        return np.searchsorted(self.seg_start, self.lane_start[lane] + k, side="right") - 1

    def lane_shards(self, lane: int) -> list[int]:
        """The shards lane ``lane`` reads, in order."""
        return [int(s) for s in self.seg_shard[self.seg_lane == lane]]


class StreamPlan:
    """The per-epoch plans of a dataset whose sample ``i`` lies in shard ``shard_of[i]``."""

    def __init__(self, shard_of: np.ndarray, num_shards: int, lanes: int, seed: int, shuffle: bool):
        if lanes < 1:
            raise ValueError(f"image.stream_lanes={lanes}: at least 1 lane")
        self.shard_of = np.asarray(shard_of, dtype=np.int64)
        self.num_shards, self.lanes, self.seed, self.shuffle = num_shards, lanes, seed, shuffle
        self._cached: tuple[int, EpochPlan] | None = None

    def epoch(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` (the last one computed is kept)."""
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, EpochPlan(self.sequence(epoch), self.shard_of, self.lanes))
        return self._cached[1]

    def sequence(self, epoch: int) -> np.ndarray:
        """The epoch's samples shard by shard: shards in a random order from ``(seed, epoch)``, the
        samples of each in a random order (stored order and listed shard order without shuffle)."""
        n = len(self.shard_of)
        if not self.shuffle:
            return np.argsort(self.shard_of, kind="stable").astype(np.int64)
        rng = np.random.default_rng([self.seed, epoch, 0x5742])
        rank_of_shard = np.empty(self.num_shards, dtype=np.int64)
        rank_of_shard[rng.permutation(self.num_shards)] = np.arange(self.num_shards)
        within = rng.permutation(n)
        return within[np.argsort(rank_of_shard[self.shard_of[within]], kind="stable")].astype(np.int64)


class Spool:
    """Whole shards copied ahead of use into a private local folder (see the module docstring).

    ``locations``: every shard's URL (or path); ``max_bytes``/``max_shards``: the bound on what is
    spooled and in flight. :meth:`want` is called before each batch with the shards it needs now and
    the shards to read ahead, both in order."""

    def __init__(self, locations: list[str], max_bytes: int, max_shards: int, base: str | None = None):
        self.locations, self.max_bytes, self.max_shards = list(locations), int(max_bytes), int(max_shards)
        base = base or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        remove_dead_spools(base)
        self.folder = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{socket.gethostname()}-{processes.owner_tag()}-",
                                       dir=base)
        self.sizes: dict[int, int] = {}
        self.jobs: dict[int, tuple[Future, threading.Event]] = {}
        self.fetched = 0          # shards downloaded whole
        self.fetched_bytes = 0
        self.waited = 0.0         # seconds batches waited for downloads
        self.peak_bytes = 0       # the most spooled + in flight at once
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.RLock()  # jobs: changed by the trainer, read by the downloads' callbacks
        self._serial = 0
        self._threads = [threading.Thread(target=self._download_loop, name=f"hvdtrain-spool-{i}", daemon=True)
                         for i in range(DOWNLOADERS)]
        for thread in self._threads:
            thread.start()
        self._closed = False
        atexit.register(self.close)

    def path(self, shard: int) -> str:
        """Where shard ``shard``'s spooled copy lives (when it is there)."""
        return os.path.join(self.folder, spool_name(shard, self.locations[shard].rsplit("/", 1)[-1]))

    def size(self, shard: int) -> int:
        """Shard ``shard``'s size in bytes (asked once)."""
        if shard not in self.sizes:
            location = self.locations[shard]
            self.sizes[shard] = remote.stat(location)[0] if remote.is_url(location) else os.path.getsize(location)
        return self.sizes[shard]

    def want(self, needed: list[int], ahead: list[int]) -> list[int]:
        """Keep ``needed`` then ``ahead`` spooled, as many as the bound admits (in that order),
        drop the rest, and wait until the admitted ``needed`` shards are there; return those."""
        admitted, total = [], 0
        for shard in dict.fromkeys([*needed, *ahead]):
            size = self.size(shard)
            if len(admitted) >= self.max_shards or total + size > self.max_bytes:
                if shard in needed:
                    continue  # read by range requests
                break
            admitted.append(shard)
            total += size
        keep = set(admitted)
        with self._lock:
            for shard in [s for s in self.jobs if s not in keep]:
                self._drop(shard)
            for shard in admitted:
                job = self.jobs.get(shard)
                if job is not None and job[0].done() and job[0].exception() is not None and shard not in needed:
                    self._drop(shard)  # a failed read-ahead: tried again when it is needed
                    job = None
                if job is None:
                    stop, future = threading.Event(), Future()
                    self.jobs[shard] = (future, stop)
                    self._serial += 1
                    self._queue.put((shard, future, stop, f"{self.path(shard)}.{self._serial}.part"))
        self.peak_bytes = max(self.peak_bytes, total)
        ready = [s for s in needed if s in keep]
        started = time.perf_counter()
        for shard in ready:
            self.jobs[shard][0].result()  # raises the download's error
        self.waited += time.perf_counter() - started
        return ready

    def _drop(self, shard: int) -> None:
        """Forget shard ``shard``: stop its download, delete its copy (once the download has ended,
        unless the shard is wanted again by then). Called under the lock."""
        future, stop = self.jobs.pop(shard)
        stop.set()
        future.add_done_callback(lambda _f: self._forget(shard))  # at once if it is done

    def _forget(self, shard: int) -> None:
        with self._lock:
            if shard not in self.jobs:
                _unlink_quietly(self.path(shard))

    def _download_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            shard, future, stop, part = item
            if stop.is_set():
                future.set_exception(InterruptedError("dropped before it started"))
                continue
            try:
                location = self.locations[shard]
                if remote.is_url(location):
                    written = remote.fetch(location, self.path(shard), self.size(shard), stop, part)
                else:
                    shutil.copyfile(location, part)
                    os.replace(part, self.path(shard))
                    written = self.size(shard)
                self.fetched += 1
                self.fetched_bytes += written
                future.set_result(written)
            except BaseException as exc:  # noqa: BLE001  (handed to the batch that needs the shard)
                future.set_exception(exc)

    def spooled(self) -> list[int]:
        """The shards whose copy is complete now."""
        return sorted(s for s, (f, _) in self.jobs.items() if f.done() and f.exception() is None)

    def close(self) -> None:
        """Stop the downloads and remove the folder (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for _, stop in self.jobs.values():
            stop.set()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=2.0)
        shutil.rmtree(self.folder, ignore_errors=True)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_dead_spools(base: str) -> list[str]:
    """Remove the spool folders under ``base`` that processes of this host left when killed: a
    folder is named ``hvdtrain-spool-<host>-<pid namespace>-<pid>-<start time>-<random>`` after its
    owner (:func:`hvdtrain.core.processes.owner_tag`) and removed only when that owner is gone
    (:func:`~hvdtrain.core.processes.owner_gone`, as for shared-memory segments: never one of
    another pid namespace, such as another container with the same host name, nor of a live process)."""
    removed, prefix = [], f"{SPOOL_PREFIX}{socket.gethostname()}-"
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        parts = name[len(prefix):].split("-", 3) if name.startswith(prefix) else []
        if len(parts) != 4 or not processes.owner_gone(*parts[:3]):
            continue  # not a spool's name, or its owner is alive or not of this pid namespace
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        removed.append(name)
    return removed


class Stream:
    """What a dataset in streaming mode adds: the plan, the loop's order undone, the spool.

    ``shard_of``: the shard of each dataset sample; ``train``: the loop deals training samples
    through ``epoch_order(count, epoch, seed, shuffle)`` (padded to whole rounds), validation
    samples in their order (no shuffle, no padding)."""

    def __init__(self, shard_of: np.ndarray, locations: list[str], *, lanes: int, seed: int, shuffle: bool,
                 train: bool, max_bytes: int, max_shards: int, spool_dir: str | None = None):
        self.count, self.train, self.seed, self.shuffle = len(shard_of), train, seed, shuffle
        self.plan = StreamPlan(shard_of, len(locations), lanes, seed, shuffle and train)
        self.spool = Spool(locations, max_bytes, max_shards, spool_dir)
        self._inverse: tuple[int, np.ndarray] | None = None
        self._epoch: int | None = None
        self._last = -1                     # the last position handed out this epoch

    @property
    def folder(self) -> str:
        """The spool folder (decoding workers read spooled shards from it)."""
        return self.spool.folder

    def _positions(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """The epoch positions of the loop's ``indices``: the inverse of its order; an index the
        padding repeats (it then has two positions, ``p`` and ``count + p``) gets the one nearer the
        batch's other positions (the padding comes last; a batch of one is placed by the batch before it)."""
        if not self.train:
            return indices.copy()
        if self._inverse is None or self._inverse[0] != epoch:
            order = sharding.epoch_order(self.count, epoch, self.seed, self.shuffle)
            inverse = np.empty(self.count, dtype=np.int64)
            inverse[order] = np.arange(self.count, dtype=np.int64)
            self._inverse = (epoch, inverse)
        positions = self._inverse[1][indices]
        reference = float(np.median(positions)) if len(positions) > 1 else self._last
        late = positions + self.count
        pick = np.abs(late - reference) < np.abs(positions - reference)
        return np.where(pick, late, positions)

    def samples(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """The plan's samples in place of the loop's ``indices`` (what the batch holds), after
        making sure the shards they stream from are spooled (or reading them remotely)."""
        indices = np.asarray(indices, dtype=np.int64)
        if epoch != self._epoch:
            self._epoch, self._last = epoch, -1
        plan = self.plan.epoch(epoch if self.train else 0)
        positions = self._positions(indices, epoch)
        self._last = int(positions.max(initial=self._last))
        inside = positions[positions < self.count]  # the padding (past the end) re-reads: range requests
        self._spool(plan, inside)
        return plan.order[np.where(positions < self.count, positions, positions - self.count)]

    def _spool(self, plan: EpochPlan, positions: np.ndarray) -> None:
        """Spool the shards of ``positions`` (in lane order) and read ahead in their lanes."""
        segments = plan.segments_of(positions)
        needed: list[int] = []
        fronts: dict[int, int] = {}
        for seg in sorted(set(segments.tolist())):
            needed.append(int(plan.seg_shard[seg]))
            lane = int(plan.seg_lane[seg])
            fronts[lane] = max(fronts.get(lane, -1), seg)
        ahead, follow = [], {lane: seg + 1 for lane, seg in fronts.items()}
        while follow and len(ahead) < self.spool.max_shards:
            for lane in sorted(follow):
                seg = follow[lane]
                if seg >= len(plan.seg_start) or plan.seg_lane[seg] != lane:
                    del follow[lane]
                    continue
                ahead.append(int(plan.seg_shard[seg]))
                follow[lane] = seg + 1
        self.spool.want(needed, ahead)

    def close(self) -> None:
        """Stop the downloads, remove the spool."""
        self.spool.close()


def open_stream(index, rows: np.ndarray | None, *, lanes: int, seed: int, shuffle: bool, train: bool,
                max_bytes: int, max_shards: int, spool_dir: str | None = None) -> Stream:
    """A :class:`Stream` over the samples ``rows`` (None: all) of a shard index."""
    if index.where is None:
        raise DataError(f"image.read=stream reads shards; {index.root} is an ImageFolder tree, read by random "
                        f"access (image.read=random)")
    shard_of = index.where[:, 0] if rows is None else index.where[np.asarray(rows), 0]
    reader = index.reader()
    locations = [str(reader.location(i)) for i in range(len(index.shards))]
    return Stream(np.asarray(shard_of), locations, lanes=lanes, seed=seed, shuffle=shuffle, train=train,
                  max_bytes=max_bytes, max_shards=max_shards, spool_dir=spool_dir)
