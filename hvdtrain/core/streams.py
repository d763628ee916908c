"""Iterable sources read once into memory: a torch ``IterableDataset`` or an unbatched ``tf.data.Dataset``.

The loop reads random access (the order from ``(train.seed, epoch)``, a resume exact at any world
size). A stream has no index, so :func:`read` gives it one: every rank reads the whole
stream once, when the task is built (as Accelerate's ``IterableDatasetShard`` does, where every
process iterates all of it and keeps its share), and sample ``i`` is the ``i``-th element it
yielded (:class:`hvdtrain.core.sources.StreamSource`). From there it is a map-style source with
every guarantee of one, provided the stream yields the same elements in the same order on every
rank and in every run (a fixed seed for any shuffle of its own). Resume: a checkpoint holds a
position in the ``(train.seed, epoch)`` order of these indices, not in the stream; ``--resume``
reads the stream again from its start and goes on at the next sample, at the same or another
world size (nothing is refused). A stream that yields other elements than in the run that wrote
the checkpoint is not detected (the data check compares ranks, not runs). The elements are read
by the loop's thread, not by data workers: they are in memory already. Ranks that read different elements (a stream sharded by the user with
``ds.shard(size, rank)``, an unseeded shuffle) are refused at start-up by the data check, which
compares the fingerprint (:func:`fingerprint`) across ranks. A stream must end and
fit in memory (:data:`LIMIT_BYTES`, counted in NumPy bytes as it is read); larger data, or data
that never ends, is refused in one line naming the alternatives: a map-style ``Dataset``, a Hugging
Face ``datasets.Dataset`` (memory-mapped Arrow), or the image pipeline's shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Iterable

import numpy as np

from hvdtrain.core.config import ConfigError

LIMIT_BYTES = 4 * 2**30  # what a stream may hold in memory on each rank
ALTERNATIVES = ("for data that does not fit, give a map-style torch.utils.data.Dataset, a Hugging Face "
                "datasets.Dataset (memory-mapped), or shards for the image pipeline (docs: guides/data)")


def _leaves(item: Any) -> Iterable[Any]:
    if isinstance(item, Mapping):
        for value in item.values():
            yield from _leaves(value)
    elif isinstance(item, (tuple, list)):
        for value in item:
            yield from _leaves(value)
    else:
        yield item


def _nbytes(item: Any) -> int:
    return sum(len(leaf) if isinstance(leaf, (str, bytes)) else np.asarray(leaf).nbytes for leaf in _leaves(item))


def read(data: Any, field: str, what: str) -> list[Any]:
    """The elements of stream ``data`` (``what`` names it in messages) in the order it yields them;
    :class:`~hvdtrain.core.config.ConfigError` when it holds nothing or more than :data:`LIMIT_BYTES`."""
    elements = data.as_numpy_iterator() if hasattr(data, "as_numpy_iterator") else iter(data)
    items, held = [], 0
    for item in elements:
        held += _nbytes(item)
        if held > LIMIT_BYTES:
            raise ConfigError(f"TrainTask.{field}: {what} holds more than {LIMIT_BYTES / 2**30:g} GiB after "
                              f"{len(items):,} elements; hvdtrain reads a stream into memory on every rank to "
                              f"give it random access; {ALTERNATIVES}")
        items.append(item)
    if not items:
        raise ConfigError(f"TrainTask.{field}: {what} yielded no elements")
    return items


def fingerprint(items: list[Any]) -> str:
    """A content hash of ``items`` in order (every rank must have read the same stream)."""
    digest = hashlib.sha256()
    for item in items:
        for leaf in _leaves(item):
            digest.update(leaf if isinstance(leaf, bytes) else str(leaf).encode() if isinstance(leaf, str)
                          else np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()
