"""The TensorFlow sharded optimizer's bucketed flat layout (:class:`hvdtrain.tensorflow.sharded.FlatGroup`):
rows cut into buckets, each padded to the world size, every rank's shard the concatenation of its
slices; the graph and NumPy sides agree and round-trip. Collectives are tested under horovodrun
(tests/distributed/test_sharded_optimizer_tf.py)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hvdtrain.tensorflow.sharded import FlatGroup  # noqa: E402

SHAPES = [(7, 5), (5, 3), (), (4,), (2, 9)]  # 35 + 15 + 1 + 4 + 18 = 73 elements


def group(size, rank, bucket_elements):
    rng = np.random.default_rng(0)
    variables = [tf.Variable(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
    return FlatGroup(variables, size, rank, bucket_elements), variables


def test_rows_are_cut_into_buckets_within_the_limit():
    flat, _ = group(2, 0, 16)
    pieces = [b.pieces for b in flat.buckets]
    assert pieces[0] == [(0, 0, 3, 15)] and pieces[1] == [(0, 3, 6, 15)]  # 7x5 cut at rows
    assert pieces[2] == [(0, 6, 7, 5), (1, 0, 3, 9)]  # 14: the next row of 3 does not fit
    assert pieces[3] == [(1, 3, 5, 6), (2, 0, 1, 1), (3, 0, 4, 4)]
    assert pieces[4] == [(4, 0, 1, 9)] and pieces[5] == [(4, 1, 2, 9)]  # a row of 9 does not share 16 with 9
    assert sum(b.total for b in flat.buckets) == 73 and all(b.total <= 16 for b in flat.buckets)
    assert flat.shard == sum(-(-b.total // 2) for b in flat.buckets) == 39
    assert [b.offset for b in flat.buckets] == [0, 8, 16, 23, 29, 34]
    whole, _ = group(3, 1, 10**9)  # one bucket: the layout before buckets
    assert len(whole.buckets) == 1 and whole.shard == 25 and whole.padded == 75


@pytest.mark.parametrize("size,limit", [(1, 16), (2, 16), (3, 7), (4, 1), (2, 10**9)])
def test_graph_and_host_layouts_agree_and_round_trip(size, limit):
    for rank in range(size):
        flat, variables = group(size, rank, limit)
        arrays = [v.numpy() for v in variables]
        host = flat.flatten_host(arrays)
        np.testing.assert_array_equal(flat.flatten(variables).numpy(), host)
        assert host.shape == (flat.padded,) and host.sum() == pytest.approx(sum(a.sum() for a in arrays), rel=1e-5)
        for got, want in zip(flat.split_host(host), arrays):
            np.testing.assert_array_equal(got, want)
        # rank r's shard is each bucket's r-th slice, in bucket order
        mine = np.concatenate([flat.bucket_flat(b, variables).numpy().reshape(size, b.shard)[rank]
                               for b in flat.buckets])
        np.testing.assert_array_equal(flat.mine(host), mine)
        assert flat.mine(host).shape == (flat.shard,)


def test_assigning_every_bucket_restores_every_variable():
    flat, variables = group(2, 0, 16)
    wanted = [v.numpy() for v in variables]
    values = [flat.bucket_flat(b, variables) for b in flat.buckets]
    for v in variables:
        v.assign(tf.zeros_like(v))
    for bucket, value in zip(flat.buckets, values):
        flat.assign_bucket(bucket, value)
    for v, want in zip(variables, wanted):
        np.testing.assert_array_equal(v.numpy(), want)


def test_missing_gradients_are_zeros():
    flat, variables = group(2, 1, 16)
    tensors = [None, variables[1], None, variables[3], None]
    host = flat.flatten_host([None, variables[1].numpy(), None, variables[3].numpy(), None])
    np.testing.assert_array_equal(flat.flatten(tensors).numpy(), host)
    parts = flat.split_host(host)
    assert not parts[0].any() and not parts[4].any() and parts[2].shape == ()
    np.testing.assert_array_equal(parts[1], variables[1].numpy())
