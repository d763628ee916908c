"""The image dataset the training loop consumes: ``get_batch(indices, epoch)`` -> uint8 NHWC + int64 labels.

Samples are decoded by a :class:`~hvdtrain.data.workers.WorkerPool` (or in this process with
``workers=0``); the loop's prefetch thread keeps ``data.prefetch_batches`` batches ready, so
read-ahead is bounded. Unreadable files: ``bad_files="error"`` raises a
:class:`~hvdtrain.data.index.DataError` naming the file; ``"skip"`` puts a deterministic other
sample in its place (the same choice on every rank and every run, so every rank keeps the same
number of steps) and the count is reported once per epoch.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.core.redact import redact_text
from hvdtrain.data.decode import DECODE_ERRORS, decode
from hvdtrain.data.entries import map_arrays
from hvdtrain.data.index import DataError, ImageIndex
from hvdtrain.data.reader import SampleReader
from hvdtrain.data.transforms import TransformPolicy, sample_op

MAX_SUBSTITUTES = 16


def substitute(sample: int, attempt: int, count: int) -> int:
    """The ``attempt``-th stand-in for unreadable ``sample`` (a fixed scramble of the index)."""
    return int((sample * 2654435761 + attempt * 40503) % count) if count > 1 else sample


@dataclass
class ImageSource:
    """What a worker needs to produce samples of one dataset (sent to each worker once)."""

    root: str
    cache_dir: str
    rows: np.ndarray | None
    policy: TransformPolicy
    grayscale: bool
    seed: int
    train: bool
    bad_files: str
    count: int
    spool: str | None = None
    _arrays: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrays"] = None
        return state

    @property
    def reader(self) -> SampleReader:
        """This process's reader of the index entry (opened lazily: each worker has its own)."""
        if self._arrays is None:
            entry = Path(self.cache_dir)
            meta = json.loads((entry / "meta.json").read_text())
            arrays = map_arrays(entry, ("blob", "offsets", "where"))
            self._arrays = SampleReader(self.root, meta.get("kind", "file"), list(meta.get("shards", [])),
                                        arrays["blob"], arrays["offsets"], arrays.get("where"), meta.get("column"),
                                        self.spool)
        return self._arrays

    def _row(self, sample: int) -> int:
        return int(self.rows[sample]) if self.rows is not None else int(sample)

    def _path(self, sample: int) -> Path:
        """The file holding ``sample`` (the image file, or its shard)."""
        return self.reader.file(self._row(sample))

    def name(self, sample: int) -> str:
        """``sample`` as errors name it: its file, or its shard and key."""
        return self.reader.name(self._row(sample))

    def _decode(self, sample: int, epoch: int) -> np.ndarray:
        def op_for(width: int, height: int):
            return sample_op(self.policy, width, height, self.seed, epoch, sample, self.train)

        return decode(self.reader.read(self._row(sample)), self.policy, op_for, self.grayscale)

    def fill(self, out: np.ndarray, positions: np.ndarray, samples: np.ndarray, epoch: int) -> list:
        """Write sample ``samples[i]`` into ``out[positions[i]]`` (read in location order: each
        sample's pixels depend on nothing else); return the substitutions made, ``(position,
        stand-in sample, unreadable sample's name)``."""
        substituted = []
        samples = np.asarray(samples, dtype=np.int64)
        rows = self.rows[samples] if self.rows is not None else samples
        order = self.reader.order(rows)
        for pos, sample in zip(np.asarray(positions)[order], samples[order]):
            sample = int(sample)
            try:
                out[pos] = self._decode(sample, epoch)
                continue
            except DECODE_ERRORS as exc:
                bad, error = self.name(sample), exc
            if self.bad_files == "error":
                raise DataError(f"cannot decode image {bad}: {error}; fix or remove it, or set "
                                f"image.bad_files=skip to train on a stand-in sample instead")
            for attempt in range(1, MAX_SUBSTITUTES + 1):
                alt = substitute(sample, attempt, self.count)
                try:
                    out[pos] = self._decode(alt, epoch)
                except DECODE_ERRORS:
                    continue
                substituted.append((int(pos), alt, str(bad)))
                break
            else:
                raise DataError(f"cannot decode image {bad} ({error}) nor any of its {MAX_SUBSTITUTES} stand-ins")
        return substituted


class ImageDataset:
    """One split of an indexed image tree under a transform policy (see module docstring).

    ``rows`` selects a subset of the index (``data.max_train_samples``); ``pool`` None decodes in
    this process; ``grayscale`` (None: the index's sample decides) is the colour mode every image
    is converted to: give the validation split the training split's. ``stream`` (a
    :class:`~hvdtrain.data.stream.Stream` over the same rows): streaming mode, where the batch at
    the loop's indices holds the stream plan's samples at those positions.
    """

    def __init__(self, index: ImageIndex, policy: TransformPolicy, *, train: bool, seed: int,
                 bad_files: str = "error", rows: np.ndarray | None = None, pool: Any = None, name: str = "train",
                 grayscale: bool | None = None, stream: Any = None):
        self.index, self.policy, self.train, self.name = index, policy, train, name
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self.grayscale = index.grayscale if grayscale is None else bool(grayscale)
        count = len(self.rows) if self.rows is not None else len(index)
        self.stream = stream
        self.source = ImageSource(str(index.root), str(index.cache_dir), self.rows, policy, self.grayscale, seed,
                                  train, bad_files, count, stream.folder if stream is not None else None)
        self.pool = pool
        self.source_id = pool.add_source(self.source) if pool is not None else None
        self._count = count
        self._epoch: int | None = None
        self._skipped: list[str] = []
        self.skipped_per_epoch: dict[int, int] = {}
        atexit.register(self.report)  # the last epoch's count (no later batch announces its end)

    def __len__(self) -> int:
        return self._count

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) of every image in a batch."""
        return (self.policy.size, self.policy.size)

    @property
    def channels(self) -> int:
        """1 for grayscale, 3 for RGB."""
        return 1 if self.grayscale else 3

    @property
    def num_classes(self) -> int:
        """Number of classes of the index."""
        return len(self.index.classes)

    def fingerprint(self) -> str:
        """SHA-256 of what this dataset yields: the index's content, the rows taken, the transform
        and colour mode (equal on every rank that sees the same tree with the same settings)."""
        digest = hashlib.sha256(json.dumps([self.index.digest, self.policy.__dict__, self.grayscale, self.train,
                                            self.source.seed, self._count,
                                            *([self.stream.plan.lanes] if self.stream is not None else [])],
                                           sort_keys=True, default=str).encode())
        if self.rows is not None:
            digest.update(self.rows.tobytes())
        return digest.hexdigest()

    def labels_of(self, samples: np.ndarray) -> np.ndarray:
        """int64 labels of dataset samples."""
        rows = self.rows[samples] if self.rows is not None else samples
        return np.asarray(self.index.labels[rows], dtype=np.int64)

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """uint8 ``(n, size, size, channels)`` images and int64 labels of samples ``indices``."""
        indices = np.asarray(indices, dtype=np.int64)
        if self.stream is not None:
            indices = self.stream.samples(indices, epoch)
        if epoch != self._epoch:
            self.report()
            self._epoch = epoch
        shape = (len(indices), self.policy.size, self.policy.size, self.channels)
        if self.pool is not None:
            images, substituted = self.pool.run(self.source_id, shape, indices, epoch)
        else:
            images = np.empty(shape, dtype=np.uint8)
            substituted = self.source.fill(images, np.arange(len(indices)), indices, epoch)
        labels = self.labels_of(indices)
        for pos, alt, path in substituted:
            labels[pos] = self.labels_of(np.asarray([alt]))[0]
            self._skipped.append(path)
        return images, labels

    def report(self) -> None:
        """Print how many unreadable images were replaced in the epoch that just ended (if any)."""
        if self._skipped and self._epoch is not None:
            rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
            what = "epoch " + str(self._epoch + 1) if self._epoch >= 0 else "validation"
            print(f"hvdtrain: rank {rank}: {what}: {len(self._skipped)} unreadable {self.name} image(s) replaced by "
                  f"stand-ins (image.bad_files=skip), first: {redact_text(str(self._skipped[0]))}", file=sys.stderr,
                  flush=True)
            self.skipped_per_epoch[self._epoch] = len(self._skipped)
        self._skipped = []
