"""Per-rank data shards: disjoint, covering the epoch, reshuffled deterministically per epoch.

Training shards are equal-sized on every rank so that every rank runs the same number of steps
(a rank with one step more would wait forever in an allreduce). When the dataset size does not
divide by the world size, ``remainder="pad"`` repeats the first ``world_size - n % world_size``
samples of the epoch's shuffled order (every sample is seen at least once, those few twice) and
``remainder="drop"`` leaves the last ``n % world_size`` samples of that order out (every sample
at most once; a different few each epoch).

Evaluation shards (:func:`eval_shard`) need no padding: rank ``r`` takes every ``world_size``-th
sample, and the metrics are summed across ranks, so each validation sample counts exactly once.
"""

from __future__ import annotations

import math

import numpy as np


def epoch_order(num_samples: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
    """The order of all samples in ``epoch``: a permutation seeded by ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_samples).astype(np.int64)


def shard_size(num_samples: int, world_size: int, remainder: str = "pad") -> int:
    """Samples per rank per epoch."""
    if remainder == "pad":
        return math.ceil(num_samples / world_size)
    if remainder == "drop":
        return num_samples // world_size
    raise ValueError(f"remainder {remainder!r} is not allowed; choose one of: pad, drop")


def train_shard(num_samples: int, rank: int, world_size: int, epoch: int, seed: int,
                shuffle: bool = True, remainder: str = "pad", start: int = 0) -> np.ndarray:
    """Indices rank ``rank`` trains on in ``epoch``; all ranks get the same count.

    ``start`` skips the first ``start`` positions of the epoch's (padded) order: what a resumed
    run has already consumed. With the world size unchanged this is exactly the rest of each
    rank's original shard; with another world size the rest of the epoch is dealt anew.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    if num_samples < world_size:
        raise ValueError(f"{num_samples} training samples cannot be shared by {world_size} workers; "
                         f"each needs at least one")
    order = epoch_order(num_samples, epoch, seed, shuffle)
    per_rank = shard_size(num_samples, world_size, remainder)
    total = per_rank * world_size
    if total > num_samples:
        order = np.concatenate([order, order[: total - num_samples]])
    rest = order[:total][start:]
    extra = len(rest) % world_size  # only after a resume with another world size
    if extra:
        rest = np.concatenate([rest, rest[: world_size - extra]]) if remainder == "pad" else rest[: len(rest) - extra]
    return rest[rank::world_size]


def eval_shard(num_samples: int, rank: int, world_size: int) -> np.ndarray:
    """Indices rank ``rank`` evaluates: every ``world_size``-th sample, no padding, no overlap."""
    return np.arange(rank, num_samples, world_size, dtype=np.int64)


def batches(indices: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Split a shard into consecutive batches; the last one may be smaller."""
    return [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
