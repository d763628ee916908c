"""Data for ``model.fit`` on Horovod (public as :mod:`hvdtrain.keras`): each worker's share of a
``tf.data.Dataset`` or of NumPy arrays, and batches whose order depends only on the seed and the
epoch, so that a resumed ``fit`` sees the batches the uninterrupted one would have seen.
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

EPOCHS_AHEAD = 1 << 31  # batches() is endless in practice: fit's epochs and steps_per_epoch end it


def _world(rank: int | None, size: int | None) -> tuple[int, int]:
    rank = hvd.rank() if rank is None else int(rank)
    size = hvd.size() if size is None else int(size)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"shard: rank={rank!r}, size={size!r}: need 0 <= rank < size")
    return rank, size


def shard(data: Any, rank: int | None = None, size: int | None = None) -> Any:
    """This worker's share of ``data``, by ``tf.data.Dataset.shard(size, rank)``'s rule: the
    elements ``rank, rank + size, rank + 2 size, ...`` (``rank``/``size``: Horovod's by default).

    ``data``: a ``tf.data.Dataset`` (returned as ``data.shard(size, rank)``; shard before shuffling,
    batching and augmenting, so each worker reads its own files or rows), or a NumPy array, or a
    tuple, list or dict of arrays of one length (the same rows of each, the same structure back).
    With ``len % size`` left over, the first workers get one element more; for
    :class:`~hvdtrain.keras.MetricAverageCallback` and equal steps per epoch, give every worker the
    same number of batches (:func:`batches` drops the incomplete one)."""
    rank, size = _world(rank, size)
    if isinstance(data, tf.data.Dataset):
        return data.shard(size, rank)
    leaves = [data] if isinstance(data, np.ndarray) else list(data.values()) if isinstance(data, dict) \
        else list(data) if isinstance(data, (tuple, list)) else None
    if not leaves or not all(isinstance(a, np.ndarray) for a in leaves):
        raise TypeError(f"shard: {type(data).__name__} is not a tf.data.Dataset, a NumPy array, or a tuple, "
                        f"list or dict of NumPy arrays")
    lengths = {len(a) for a in leaves}
    if len(lengths) != 1:
        raise ValueError(f"shard: the arrays have different lengths {sorted(lengths)}")
    if isinstance(data, np.ndarray):
        return data[rank::size]
    if isinstance(data, dict):
        return {k: v[rank::size] for k, v in data.items()}
    return type(data)(a[rank::size] for a in data)


def batches(x: Any, y: Any = None, batch_size: int = 32, *, seed: int = 0, initial_epoch: int = 0,
            shuffle: bool = True) -> tuple[tf.data.Dataset, int]:
    """``(dataset, steps_per_epoch)`` for ``model.fit(dataset, steps_per_epoch=..., epochs=...,
    initial_epoch=...)``: batches of ``batch_size`` rows of ``x`` (and ``y``; arrays or dicts of
    arrays already :func:`shard`-ed), epoch after epoch from ``initial_epoch``. Epoch ``e``'s order
    is a permutation drawn from ``(seed, e)`` alone (``tf.random.experimental.stateless_shuffle``;
    ``shuffle=False``: the rows in order), so a run resumed at epoch ``e`` gets the batches the
    uninterrupted run got; the rows after the last whole batch are left out of that epoch. Every
    worker calls it (one allreduce: all take the steps of the worker with the fewest rows)."""
    data = (x,) if y is None else (x, y)
    tensors = tf.nest.map_structure(tf.convert_to_tensor, data)
    rows = int(tf.nest.flatten(tensors)[0].shape[0])
    batch_size = int(batch_size)
    steps = rows // batch_size if batch_size >= 1 else 0
    if steps < 1:
        raise ValueError(f"batches: batch_size={batch_size!r} needs 1 <= batch_size <= the {rows} rows given")
    if hvd.size() > 1:  # every worker takes as many steps as the one with the fewest rows (else one waits forever)
        steps = int(hvd.allreduce(tf.constant(steps, tf.int64), op=hvd.Min, name="hvdtrain.keras.batches").numpy())

    def epoch_order(epoch: Any) -> tf.data.Dataset:
        order = tf.range(rows, dtype=tf.int64)
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(order, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        return tf.data.Dataset.from_tensor_slices(tf.reshape(order[:steps * batch_size], (steps, batch_size)))

    def gather(rows_of_batch: Any) -> Any:
        return tf.nest.map_structure(lambda t: tf.gather(t, rows_of_batch), tensors)

    dataset = tf.data.Dataset.range(int(initial_epoch), EPOCHS_AHEAD).flat_map(epoch_order)
    return dataset.map(gather).prefetch(2), steps
