"""Data for ``model.fit`` on Horovod (public as :mod:`hvdtrain.keras`): each worker's share of a
``tf.data.Dataset`` or of NumPy arrays, and batches whose order depends only on the seed and the
epoch, so that a resumed ``fit`` sees the batches the uninterrupted one would have seen; with a
fixed global batch (``batches(..., global_batch_size=G)``) the same batches at any number of
workers, so that it may also resume on another one.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvdtrain.core.batching import dividing_world_sizes
from hvdtrain.core.config_error import ConfigError

EPOCHS_AHEAD = 1 << 31  # batches() is endless in practice: fit's epochs and steps_per_epoch end it


def _world(rank: int | None, size: int | None, caller: str = "shard") -> tuple[int, int]:
    rank = hvd.rank() if rank is None else int(rank)
    size = hvd.size() if size is None else int(size)
    if size < 1 or not 0 <= rank < size:
        raise ConfigError(f"{caller}: rank={rank!r}, size={size!r}: need 0 <= rank < size")
    return rank, size


def shard(data: Any, rank: int | None = None, size: int | None = None) -> Any:
    """This worker's share of ``data``, by ``tf.data.Dataset.shard(size, rank)``'s rule, every
    worker the same number of elements: of ``n`` elements the first ``n - n % size`` are dealt, the
    elements ``rank, rank + size, rank + 2 size, ...`` (``rank``/``size``: Horovod's by default),
    and the last ``n % size`` are left out (rank 0 says so in one line). Workers with shares one
    element apart would run a different number of steps, and the one with a step more would wait
    for the others forever at the epoch's end.

    ``data``: a ``tf.data.Dataset`` (returned as ``data.take(n - n % size).shard(size, rank)``),
    or a NumPy array, or a tuple, list or dict of arrays of one length (the same rows of each, the
    same structure back). A dataset is sharded before shuffling, batching and augmenting, so that
    each worker reads its own files or rows: one that shuffles (or samples at random, or maps
    without a deterministic order) upstream of this point is refused, since every worker would
    deal from its own permutation (the shares would overlap and miss elements); so is one whose
    length tf.data cannot tell (its cardinality UNKNOWN, as after ``filter`` or from records read
    from files: declare it with ``ds.apply(tf.data.experimental.assert_cardinality(n))``, or shard
    the file names). An endless dataset (``repeat()``) is dealt as it is: give ``fit`` its
    ``steps_per_epoch``."""
    rank, size = _world(rank, size)
    if isinstance(data, tf.data.Dataset):
        return _shard_dataset(data, rank, size)
    leaves = [data] if isinstance(data, np.ndarray) else list(data.values()) if isinstance(data, dict) \
        else list(data) if isinstance(data, (tuple, list)) else None
    if not leaves or not all(isinstance(a, np.ndarray) for a in leaves):
        raise TypeError(f"shard: {type(data).__name__} is not a tf.data.Dataset, a NumPy array, or a tuple, "
                        f"list or dict of NumPy arrays")
    lengths = {len(a) for a in leaves}
    if len(lengths) != 1:
        raise ConfigError(f"shard: the arrays have different lengths {sorted(lengths)}")
    dealt = slice(rank, _equal_part(lengths.pop(), size, rank, "rows"), size)
    if isinstance(data, np.ndarray):
        return data[dealt]
    if isinstance(data, dict):
        return {k: v[dealt] for k, v in data.items()}
    return type(data)(a[dealt] for a in data)


def _equal_part(n: int, size: int, rank: int, what: str) -> int:
    """How many of ``n`` elements ``size`` workers share equally (``n - n % size``); rank 0 notes the
    ones left out, in one line."""
    kept = n - n % size
    if kept != n and rank == 0:
        print(f"hvdtrain: note: shard: {n:,} {what} on {size} workers: the last {n - kept} left out, so that every "
              f"worker gets {kept // size:,} and all take the same number of steps", file=sys.stderr, flush=True)
    return kept


# tf.data's datasets (class names) that order their elements anew in each process
_REORDERING = {"_ShuffleDataset": "shuffle()", "_ShuffleAndRepeatDataset": "shuffle_and_repeat()",
               "_RandomDataset": "Dataset.random() (sample_from_datasets draws from it)"}


def _shard_dataset(data: tf.data.Dataset, rank: int, size: int) -> tf.data.Dataset:
    """:func:`shard` of a ``tf.data.Dataset``: refused when upstream of here the order differs per
    process, or its length is unknown; else every worker an equal share."""
    pending, seen = [data], set()
    while pending:  # the dataset's graph of inputs, from this point up to its sources
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        name = type(node).__name__
        why = _REORDERING.get(name) or ("map(..., deterministic=False)"
                                        if getattr(node, "_deterministic", None) == "false" else None)
        if why is not None:
            raise ConfigError(f"shard: the dataset is reordered before the shard point ({name}: {why}), so each "
                              f"worker would take its share of its own order (the shares would overlap and miss "
                              f"elements); shard first, then shuffle: hk.shard(ds).shuffle(...) (and "
                              f"Dataset.list_files(..., shuffle=False))")
        pending.extend(node._inputs())
    if data.options().deterministic is False:
        raise ConfigError("shard: the dataset's options set deterministic=False, so each worker would take its "
                          "share of its own order; shard first, then set the option on each share")
    n = int(data.cardinality())
    if n == tf.data.INFINITE_CARDINALITY:
        return data.shard(size, rank)
    if n == tf.data.UNKNOWN_CARDINALITY:
        raise ConfigError("shard: tf.data cannot tell the dataset's length (cardinality UNKNOWN: after filter(), or "
                          "records read from files), so the workers' shares cannot be made equal (one with a step "
                          "more waits forever at the epoch's end); declare it with "
                          "ds.apply(tf.data.experimental.assert_cardinality(N)), or shard the file names")
    kept = _equal_part(n, size, rank, "elements")
    return (data if kept == n else data.take(kept)).shard(size, rank)


def batches(x: Any, y: Any = None, batch_size: int | None = None, *, global_batch_size: int | None = None,
            seed: int = 0, initial_epoch: int = 0, shuffle: bool = True, rank: int | None = None,
            size: int | None = None) -> tuple[tf.data.Dataset, int]:
    """``(dataset, steps_per_epoch)`` for ``model.fit(dataset, steps_per_epoch=..., epochs=...,
    initial_epoch=...)``: this worker's batches of ``x`` (and ``y``; arrays or dicts of arrays),
    epoch after epoch from ``initial_epoch``. Epoch ``e``'s order is a permutation drawn from
    ``(seed, e)`` alone (``tf.random.experimental.stateless_shuffle``; ``shuffle=False``: the rows
    in order), so a run resumed at epoch ``e`` gets the batches the uninterrupted run got; the rows
    after the last whole batch are left out of that epoch. Every worker calls it. Give one of:

    * ``global_batch_size=G`` (the Trainer's ``train.global_batch_size``): ``x``/``y`` are the
      WHOLE arrays, the same on every worker (not :func:`shard`-ed). Global batch ``b`` of epoch
      ``e`` is the rows ``order[b*G:(b+1)*G]`` of the epoch's permutation of all rows; worker
      ``rank`` takes its contiguous ``G / size`` of them (``rank``/``size``: Horovod's by default),
      and ``steps_per_epoch = rows // G`` on every worker. The mean of the workers' mean gradients
      (what :class:`~hvdtrain.keras.DistributedOptimizer` applies) is then the global batch's mean
      gradient at any world size that divides ``G`` (others are refused, naming those that can):
      a checkpoint taken on N workers resumes on M workers with the same updates (up to float
      summation order), and the learning rate needs no rescaling. With more than one worker, one
      allgather at the start checks that every worker gave the same rows.
    * ``batch_size=B`` (per worker; 32 if neither is given): ``x``/``y`` are this worker's
      :func:`shard`; the global batch is ``B`` x workers and each worker's batches depend on the
      world size. One allreduce: all take the steps of the worker with the fewest rows.
    """
    data = (x,) if y is None else (x, y)
    tensors = tf.nest.map_structure(tf.convert_to_tensor, data)
    rows = int(tf.nest.flatten(tensors)[0].shape[0])
    if global_batch_size is not None:
        if batch_size is not None:
            raise ConfigError(f"batches: batch_size={batch_size!r} (per worker) and global_batch_size="
                              f"{global_batch_size!r} (all workers together) exclude each other; give one of them")
        rank, size = _world(rank, size, "batches")
        g = int(global_batch_size)
        _check_global(g, rows, size)
        if hvd.is_initialized() and hvd.size() > 1:  # every worker calls batches(): all take part
            _check_same_rows(data, rows, g)
        take = slice(rank * (g // size), (rank + 1) * (g // size))  # this worker's contiguous part of each batch
        steps = rows // g
    else:
        if rank is not None or size is not None:
            raise ConfigError(f"batches: rank={rank!r}, size={size!r} go with global_batch_size only (batch_size "
                              f"batches the rows this worker was given: its shard(...))")
        g, take = int(32 if batch_size is None else batch_size), slice(None)
        steps = rows // g if g >= 1 else 0
        if steps < 1:
            raise ConfigError(f"batches: batch_size={g!r} needs 1 <= batch_size <= the {rows} rows given")
        if hvd.size() > 1:  # every worker takes as many steps as the one with the fewest rows (else one waits forever)
            steps = int(hvd.allreduce(tf.constant(steps, tf.int64), op=hvd.Min, name="hvdtrain.keras.batches").numpy())

    def epoch_order(epoch: Any) -> tf.data.Dataset:
        order = tf.range(rows, dtype=tf.int64)
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(order, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        return tf.data.Dataset.from_tensor_slices(tf.reshape(order[:steps * g], (steps, g))[:, take])

    def gather(rows_of_batch: Any) -> Any:
        return tf.nest.map_structure(lambda t: tf.gather(t, rows_of_batch), tensors)

    dataset = tf.data.Dataset.range(int(initial_epoch), EPOCHS_AHEAD).flat_map(epoch_order)
    return dataset.map(gather).prefetch(2), steps


def _check_global(global_batch_size: int, rows: int, size: int) -> None:
    """Refuse, in one line, a global batch that ``size`` workers cannot share equally (the
    Trainer's rule, :func:`hvdtrain.core.batching.dividing_world_sizes`) or that ``rows`` cannot fill."""
    g = global_batch_size
    if not 1 <= g <= rows:
        raise ConfigError(f"batches: global_batch_size={g!r} needs 1 <= global_batch_size <= the {rows} rows given")
    if g % size:
        sizes = ", ".join(map(str, dividing_world_sizes(g)))
        raise ConfigError(f"batches: global_batch_size={g} cannot be shared equally by {size} workers; launch "
                          f"{sizes} workers (the world sizes that divide {g}), or change global_batch_size")


def _check_same_rows(data: Any, rows: int, global_batch_size: int) -> None:
    """With a global batch every worker must hold the whole arrays: compare the row count and a
    digest of the first and last rows across the workers (one allgather), the same error on all."""
    digest = hashlib.sha256()
    for leaf in tf.nest.flatten(data):
        for row in (leaf[:1], leaf[-1:]):
            digest.update(np.ascontiguousarray(np.asarray(row)).tobytes())
    mine = [rows, int.from_bytes(digest.digest()[:7], "little")]
    everyone = hvd.allgather(tf.constant([mine], tf.int64), name="hvdtrain.keras.batches.rows").numpy().tolist()
    if any(other != everyone[0] for other in everyone):
        counts = ", ".join(f"worker {r}: {n} rows" for r, (n, _) in enumerate(everyone))
        raise ConfigError(f"batches: global_batch_size={global_batch_size} takes the whole arrays, the same on "
                          f"every worker, but the workers gave different rows ({counts}); pass the arrays before "
                          f"shard(...), or use batch_size= (per worker) for sharded data")
