"""hvdtrain.core.sharding: per-rank training shards, evaluation shards and batches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hvdtrain.core.sharding import batches, epoch_order, eval_shard, shard_size, train_shard

WORLD_SIZES = [1, 2, 3, 4, 5]
SIZES = [1, 7, 10, 12, 101]
CASES = [(n, ws) for n in SIZES for ws in WORLD_SIZES if n >= ws]
DIVIDING = [(n, ws) for n, ws in CASES if n % ws == 0]
SEEDS_EPOCHS = [(42, 0), (42, 3), (7, 1)]


def _shards(n, ws, epoch=0, seed=42, shuffle=True, remainder="pad"):
    return [train_shard(n, r, ws, epoch, seed, shuffle=shuffle, remainder=remainder) for r in range(ws)]


def _counts(shards, n):
    return np.bincount(np.concatenate(shards), minlength=n)


@pytest.mark.parametrize("seed, epoch", SEEDS_EPOCHS)
@pytest.mark.parametrize("n, ws", CASES)
def test_pad_covers_everything_with_equal_shards(n, ws, seed, epoch):
    shards = _shards(n, ws, epoch, seed, remainder="pad")
    per_rank = math.ceil(n / ws)
    total = per_rank * ws
    assert all(len(s) == per_rank for s in shards)
    assert per_rank == shard_size(n, ws, "pad")
    for s in shards:
        assert s.dtype == np.int64
        assert ((s >= 0) & (s < n)).all()
    counts = _counts(shards, n)
    assert len(counts) == n
    assert counts.sum() == total
    assert (counts >= 1).all()
    assert counts.max() <= 2
    assert (counts == 2).sum() == total - n


@pytest.mark.parametrize("seed, epoch", SEEDS_EPOCHS)
@pytest.mark.parametrize("n, ws", CASES)
def test_pad_repeats_the_first_samples_of_the_epoch_order(n, ws, seed, epoch):
    shards = _shards(n, ws, epoch, seed, remainder="pad")
    extra = math.ceil(n / ws) * ws - n
    repeated = set(np.flatnonzero(_counts(shards, n) == 2).tolist())
    assert repeated == set(epoch_order(n, epoch, seed)[:extra].tolist())


@pytest.mark.parametrize("seed, epoch", SEEDS_EPOCHS)
@pytest.mark.parametrize("n, ws", CASES)
def test_drop_uses_every_sample_at_most_once_with_equal_shards(n, ws, seed, epoch):
    shards = _shards(n, ws, epoch, seed, remainder="drop")
    per_rank = n // ws
    assert all(len(s) == per_rank for s in shards)
    assert per_rank == shard_size(n, ws, "drop")
    counts = _counts(shards, n)
    assert counts.max() <= 1
    assert (counts == 1).sum() == n - n % ws
    dropped = set(np.flatnonzero(counts == 0).tolist())
    assert dropped == set(epoch_order(n, epoch, seed)[n - n % ws:].tolist())


@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("n, ws", DIVIDING)
def test_exact_division_uses_every_sample_exactly_once(n, ws, remainder):
    shards = _shards(n, ws, epoch=2, seed=9, remainder=remainder)
    assert all(len(s) == n // ws for s in shards)
    assert (_counts(shards, n) == 1).all()
    for i in range(ws):
        for j in range(i + 1, ws):
            assert not set(shards[i].tolist()) & set(shards[j].tolist())


@pytest.mark.parametrize("n, ws", DIVIDING)
def test_pad_and_drop_agree_when_the_size_divides(n, ws):
    for a, b in zip(_shards(n, ws, 1, 3, remainder="pad"), _shards(n, ws, 1, 3, remainder="drop")):
        np.testing.assert_array_equal(a, b)


def test_pad_and_drop_differ_when_the_size_does_not_divide():
    pad, drop = _shards(101, 4, remainder="pad"), _shards(101, 4, remainder="drop")
    assert len(pad[0]) == 26 and len(drop[0]) == 25


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_same_seed_and_epoch_give_the_same_shards(remainder):
    for rank in range(3):
        a = train_shard(101, rank, 3, epoch=5, seed=11, remainder=remainder)
        b = train_shard(101, rank, 3, epoch=5, seed=11, remainder=remainder)
        np.testing.assert_array_equal(a, b)


def test_order_changes_between_epochs():
    orders = [epoch_order(101, epoch, 42) for epoch in range(4)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not np.array_equal(orders[i], orders[j])
    assert not np.array_equal(train_shard(101, 0, 2, 0, 42), train_shard(101, 0, 2, 1, 42))


def test_order_changes_between_seeds():
    assert not np.array_equal(epoch_order(101, 0, 1), epoch_order(101, 0, 2))
    assert not np.array_equal(train_shard(101, 1, 3, 0, 1), train_shard(101, 1, 3, 0, 2))


@pytest.mark.parametrize("n", SIZES)
def test_epoch_order_is_a_permutation(n):
    order = epoch_order(n, 3, 42)
    assert order.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(n))


def test_shuffled_order_is_not_the_identity():
    assert not np.array_equal(epoch_order(101, 0, 42), np.arange(101))


@pytest.mark.parametrize("epoch", [0, 1, 7])
def test_no_shuffle_gives_arange_order(epoch):
    np.testing.assert_array_equal(epoch_order(10, epoch, 42, shuffle=False), np.arange(10))
    shards = _shards(12, 3, epoch=epoch, shuffle=False)
    for rank, shard in enumerate(shards):
        np.testing.assert_array_equal(shard, np.arange(rank, 12, 3))
    # padding repeats the first samples of the (unshuffled) order
    padded = _shards(10, 4, epoch=epoch, shuffle=False, remainder="pad")
    np.testing.assert_array_equal(np.concatenate([s[:, None] for s in padded], axis=1).ravel(),
                                  np.concatenate([np.arange(10), np.arange(2)]))
    dropped = _shards(10, 4, epoch=epoch, shuffle=False, remainder="drop")
    assert sorted(np.concatenate(dropped).tolist()) == list(range(8))


@pytest.mark.parametrize("ws", WORLD_SIZES)
@pytest.mark.parametrize("n", [0, 1, 3, 7, 10, 12, 101])
def test_eval_shards_partition_the_set(n, ws):
    shards = [eval_shard(n, r, ws) for r in range(ws)]
    everything = np.concatenate(shards)
    assert len(everything) == n
    np.testing.assert_array_equal(np.sort(everything), np.arange(n))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= (1 if n else 0)


@pytest.mark.parametrize("batch_size", [1, 3, 8, 64])
@pytest.mark.parametrize("length", [0, 1, 7, 8, 25])
def test_batches_split_the_shard_in_order(length, batch_size):
    shard = np.random.default_rng(0).permutation(100)[:length]
    parts = batches(shard, batch_size)
    assert len(parts) == math.ceil(length / batch_size)
    if parts:
        np.testing.assert_array_equal(np.concatenate(parts), shard)
        assert all(len(p) == batch_size for p in parts[:-1])
        assert 1 <= len(parts[-1]) <= batch_size
    else:
        assert length == 0


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_every_rank_gets_the_same_number_of_batches(remainder):
    counts = {len(batches(train_shard(101, r, 4, 0, 42, remainder=remainder), 8)) for r in range(4)}
    assert len(counts) == 1


@pytest.mark.parametrize("rank", [-1, 3, 10])
def test_rank_outside_range_is_rejected(rank):
    with pytest.raises(ValueError, match=rf"rank {rank} is outside 0\.\.2"):
        train_shard(10, rank, 3, 0, 42)


@pytest.mark.parametrize("n, ws", [(0, 1), (1, 2), (3, 4), (4, 5)])
def test_fewer_samples_than_workers_is_rejected(n, ws):
    with pytest.raises(ValueError) as err:
        train_shard(n, 0, ws, 0, 42)
    assert f"{n} training samples" in str(err.value)
    assert f"{ws} workers" in str(err.value)


def test_unknown_remainder_is_rejected():
    with pytest.raises(ValueError, match="pad, drop"):
        shard_size(10, 3, "wrap")
    with pytest.raises(ValueError, match="'wrap'"):
        train_shard(10, 0, 3, 0, 42, remainder="wrap")
