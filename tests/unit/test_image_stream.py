"""Remote shards and streaming mode (issue 25, item 2): the per-epoch plan (every sample once, each
lane a run of whole shards, drawn from (seed, epoch)), the loop's order replaced by the plan
position for position (padding and a mid-epoch resume included), the spool's bound and clean-up,
and real WebDataset tars and Parquet served by the project's nginx (scripts/http-server.sh, range
requests) read at random and streamed: batches bitwise equal to the local files', with and without
decoding workers."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from benchmarks import photo_tree
from hvdtrain.core import processes, sharding
from hvdtrain.data import braces, remote
from hvdtrain.data.convert import convert
from hvdtrain.data.index import DataError
from hvdtrain.data.pipeline import ImageDataset
from hvdtrain.data.shards import load_shard_index
from hvdtrain.data.stream import SPOOL_PREFIX, Spool, Stream, StreamPlan, open_stream
from hvdtrain.data.transforms import choose_policy
from hvdtrain.data.workers import WorkerPool
from http_server import http_server
from trackers_support import free_port
from hvdtrain.data import ImageOptions as ImageConfig
from hvdtrain.data import open_images

REPO = Path(__file__).resolve().parents[2]
STORES = REPO / "tests" / "distributed" / "workers" / "image_stores.py"
_spec = importlib.util.spec_from_file_location("image_stores", STORES)
image_stores = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(image_stores)

NGINX = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
needs_photos = pytest.mark.skipif(not photo_tree.available() and os.environ.get("CI") != "true",
                                  reason="scikit-image's photos are not installed (scripts/install.sh)")
needs_server = pytest.mark.skipif(not NGINX and os.environ.get("CI") != "true",
                                  reason="nginx is not installed (scripts/http-server.sh --setup)")


pytestmark = pytest.mark.usefixtures("private_index_cache")


# --- the plan --------------------------------------------------------------------------------------

SIZES = [5, 9, 3, 8, 8, 2, 6]  # samples per shard: 41 in 7 shards of unequal size
SHARD_OF = np.repeat(np.arange(len(SIZES)), SIZES)


def opened(*args, **kwargs):
    """Train, val and classes of :func:`hvdtrain.data.open_images`."""
    data = open_images(*args, **kwargs)
    return data.train, data.val, data.classes


def runs(shards: np.ndarray) -> list[int]:
    """The shards a sequence reads, one entry per run of one shard."""
    return [int(s) for i, s in enumerate(shards) if i == 0 or s != shards[i - 1]]


@pytest.mark.parametrize("lanes", [1, 2, 3, 7])
def test_plan_reads_each_sample_once_and_each_lane_as_whole_shards_in_turn(lanes):
    plan = StreamPlan(SHARD_OF, len(SIZES), lanes, seed=11, shuffle=True)
    orders = []
    for epoch in range(3):
        ep = plan.epoch(epoch)
        assert sorted(ep.order.tolist()) == list(range(len(SHARD_OF)))  # every sample once
        lengths = [len(ep.order[j::lanes]) for j in range(lanes)]
        assert max(lengths) - min(lengths) <= 1
        read = []
        for j in range(lanes):
            lane = SHARD_OF[ep.order[j::lanes]]
            assert len(runs(lane)) == len(set(runs(lane))), lane  # a shard is read in one go, never revisited
            assert runs(lane) == ep.lane_shards(j)
            read += runs(lane)
        assert sorted(set(read)) == list(range(len(SIZES)))
        assert len(read) <= len(SIZES) + lanes - 1  # at most one shard cut per lane boundary
        orders.append(ep.order.copy())
    assert not np.array_equal(orders[0], orders[1])  # reshuffled per epoch ...
    again = StreamPlan(SHARD_OF, len(SIZES), lanes, seed=11, shuffle=True)
    assert np.array_equal(again.epoch(1).order, orders[1])  # ... from (seed, epoch) alone
    other = StreamPlan(SHARD_OF, len(SIZES), lanes, seed=12, shuffle=True)
    assert not np.array_equal(other.epoch(1).order, orders[1])


def test_plan_without_shuffle_keeps_the_stored_order_in_lanes():
    ep = StreamPlan(SHARD_OF, len(SIZES), 2, seed=0, shuffle=False).epoch(5)
    assert ep.order[0::2].tolist() == list(range(21)) and ep.order[1::2].tolist() == list(range(21, 41))


def local_stream(tmp_path, lanes, count=len(SHARD_OF), **options):
    """A Stream over small local files standing for SIZES' shards (the spool copies them)."""
    files = []
    for k, size in enumerate(SIZES):
        path = tmp_path / "shards" / f"s-{k}.tar"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([k]) * (1000 * size))
        files.append(str(path))
    settings = dict(lanes=lanes, seed=11, shuffle=True, train=True, max_bytes=1 << 30, max_shards=4,
                    spool_dir=str(tmp_path / "spool"))
    settings.update(options)
    return Stream(SHARD_OF[:count], files, **settings)


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_the_loops_order_is_replaced_by_the_plan_position_for_position(tmp_path, remainder):
    world, batch = 3, 4
    streams = [local_stream(tmp_path / str(r), world) for r in range(world)]
    n = len(SHARD_OF)
    for epoch in range(2):
        order = streams[0].plan.epoch(epoch).order
        got = []
        for rank, stream in enumerate(streams):
            indices = sharding.train_shard(n, rank, world, epoch, 11, True, remainder)
            got.append(np.concatenate([stream.samples(b, epoch) for b in sharding.batches(indices, batch)]))
            own = got[-1][: n // world]  # before any padding: this rank's lane only, its shards in turn
            assert runs(SHARD_OF[own]) == streams[0].plan.epoch(epoch).lane_shards(rank)[: len(runs(SHARD_OF[own]))]
        dealt = np.stack(got, axis=1).reshape(-1)  # position p went to rank p % world
        expected = np.concatenate([order, order[: len(dealt) - n]]) if remainder == "pad" else order[: len(dealt)]
        assert dealt.tolist() == expected.tolist()
    # a run resumed mid-epoch (a fresh Stream, the loop's start) gets the rest of the same plan
    start = 2 * batch * world
    fresh = local_stream(tmp_path / "fresh", world)
    rest = sharding.train_shard(n, 1, world, 1, 11, True, remainder, start=start)
    straight = sharding.train_shard(n, 1, world, 1, 11, True, remainder)
    assert fresh.samples(rest, 1).tolist() == streams[1].samples(straight, 1)[2 * batch:].tolist()
    # ... and on another world size (2 ranks, the plan's 3 lanes kept: image.stream_lanes), the rest of
    # the epoch in the same order, dealt anew (the loop pads or drops to whole rounds of 2)
    others = [local_stream(tmp_path / f"other{r}", world) for r in range(2)]
    dealt = [others[r].samples(sharding.train_shard(n, r, 2, 1, 11, True, remainder, start=start), 1) for r in range(2)]
    rest = np.stack(dealt, axis=1).reshape(-1)
    positions = np.arange(sharding.shard_size(n, 2, remainder) * 2)[start:]  # the loop's positions, padding past n
    assert rest.tolist() == streams[0].plan.epoch(1).order[positions % n].tolist()
    for stream in [*streams, fresh, *others]:
        stream.close()


def test_spool_stays_within_its_bound_and_deletes_what_was_read(tmp_path):
    world, batch = 2, 3
    for max_shards, max_bytes in ((2, 1 << 30), (4, 9000)):  # by count; by bytes (one 8-9 kB shard at a time)
        stream = local_stream(tmp_path / f"{max_shards}", world, max_shards=max_shards, max_bytes=max_bytes)
        folder = Path(stream.folder)
        lane = stream.plan.epoch(0).lane_shards(0)
        stream.samples(np.array([5]), 0)  # a probe of one sample (the TensorFlow adapter's) changes nothing below
        seen = []
        for b in sharding.batches(sharding.train_shard(len(SHARD_OF), 0, world, 0, 11), batch):
            samples = stream.samples(b, 0)
            names = [p.name for p in folder.iterdir() if not p.name.endswith(".part")]
            held = sum((folder / name).stat().st_size for name in names)
            assert len(names) <= max_shards and held <= max_bytes, names
            spooled = {int(name.split("-")[0]) for name in names}
            assert spooled & set(SHARD_OF[samples].tolist()), (names, SHARD_OF[samples])  # the batch's (first) shard
            seen.append(spooled)
        assert stream.spool.fetched <= len(lane) + 2 * max_shards  # each shard once, plus the probe's and the read-ahead
        assert set(lane) <= set().union(*seen)  # every shard of the lane was spooled in its turn
        stream.close()
        assert not folder.exists()


def test_a_killed_processs_spool_is_removed_by_the_next_one(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    namespace = processes.owner_tag().split("-")[0]  # folders are named after their owner (owner_tag)
    left = tmp_path / f"{SPOOL_PREFIX}{socket.gethostname()}-{namespace}-{dead.pid}-0-abc"
    left.mkdir()
    (left / "000001-x.tar").write_bytes(b"x")
    live = tmp_path / f"{SPOOL_PREFIX}{socket.gethostname()}-{processes.owner_tag()}-def"
    live.mkdir()
    spool = Spool([], 1 << 20, 2, str(tmp_path))
    assert not left.exists() and live.exists() and Path(spool.folder).is_dir()
    spool.close()


# --- real shards over HTTP ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A photo tree as WebDataset tars (4 per split) and Hugging Face Parquet, served by nginx."""
    if (not photo_tree.available() or not NGINX) and os.environ.get("CI") != "true":
        pytest.skip("needs scikit-image's photos and nginx (make setup installs both)")
    base = tmp_path_factory.mktemp("served")
    tree = photo_tree.make_tree(base / "folder", classes=3, train=8, val=3, size=(120, 90))
    image_stores.write_tars(tree, base / "wds", shards=4)
    image_stores.write_parquet(tree, base / "pq")
    convert(tree, base / "conv", "parquet", samples_per_shard=10)  # hvdtrain convert: a manifest lists the splits
    with http_server(base, "wds/manifest.json") as url:
        yield base, url


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(2)
    yield pool
    pool.close()


TARS = "wds/train/train-{000000..000003}.tar"


def dataset(index, stream=None, pool=None):
    policy = choose_policy("imagenet", 32, index.native_size, None, index.grayscale)
    return ImageDataset(index, policy, train=True, seed=11, pool=pool, stream=stream)


@needs_photos
@needs_server
@pytest.mark.parametrize("fmt,pattern", [("webdataset", TARS),
                                         ("parquet", "pq/data/train-{00000..00001}-of-00002.parquet")])
def test_remote_shards_read_at_random_give_the_local_shards_batches(served, pool, fmt, pattern):
    base, url = served
    local = load_shard_index(braces.expand(str(base / pattern)), fmt)
    index = load_shard_index(remote.expand(f"{url}/{pattern}"), fmt)
    assert index.built and index.root == f"{url}/{pattern.rsplit('/', 1)[0]}"
    assert index.classes == local.classes and np.array_equal(index.labels, local.labels)
    assert not load_shard_index(remote.expand(f"{url}/{pattern}"), fmt).built  # cached: size + ETag unchanged
    indices = np.random.default_rng(0).permutation(len(index))[:10]
    x, y = dataset(local).get_batch(indices, 2)
    x2, y2 = dataset(index, pool=pool).get_batch(indices, 2)  # decoding workers read by range requests
    assert np.array_equal(x, x2) and np.array_equal(y, y2)


@needs_photos
@needs_server
def test_streamed_http_batches_equal_random_access_with_any_workers_and_after_a_resume(served, pool, tmp_path):
    base, url = served
    index = load_shard_index(remote.expand(f"{url}/{TARS}"), "webdataset")
    n, world, batch = len(index), 2, 5
    reference = dataset(load_shard_index(braces.expand(str(base / TARS)), "webdataset"))

    def streamed(workers_pool):
        stream = open_stream(index, None, lanes=world, seed=11, shuffle=True, train=True, max_bytes=1 << 30,
                             max_shards=2, spool_dir=str(tmp_path))
        return dataset(index, stream, workers_pool)

    inline, workers = streamed(None), streamed(pool)
    for epoch in range(2):
        order = inline.stream.plan.epoch(epoch).order
        position = np.empty(n, dtype=np.int64)
        position[sharding.epoch_order(n, epoch, 11)] = np.arange(n)
        for b in sharding.batches(sharding.train_shard(n, 1, world, epoch, 11), batch):
            x, y = inline.get_batch(b, epoch)
            x2, y2 = workers.get_batch(b, epoch)
            x3, y3 = reference.get_batch(order[position[b] % n], epoch)
            assert np.array_equal(x, x2) and np.array_equal(x, x3) and np.array_equal(y, y3)
    assert inline.stream.spool.fetched >= 2 and inline.stream.spool.peak_bytes > 0
    resumed = streamed(pool)  # a new process's dataset, resuming mid-epoch 1 at the loop's start
    rest = sharding.train_shard(n, 1, world, 1, 11, start=batch * world)
    straight = sharding.train_shard(n, 1, world, 1, 11)[batch:]
    assert np.array_equal(resumed.get_batch(rest, 1)[0], inline.get_batch(straight, 1)[0])
    folders = [Path(d.stream.folder) for d in (inline, workers, resumed)]
    for d in (inline, workers, resumed):
        d.stream.close()
    assert not any(f.exists() for f in folders)


@needs_photos
@needs_server
def test_recipe_streams_remote_shards_named_by_url_or_listed_by_a_convert_manifest(served):
    base, url = served
    image = ImageConfig(size=32, workers=0, train_shards="train/train-{000000..000003}.tar",
                        val_shards="val/val-{000000..000003}.tar")
    train, val, classes = opened(f"{url}/wds", image, seed=3, world_size=2)
    assert classes == ["astronaut", "chelsea", "coffee"] and len(train) == 24 and len(val) == 9
    assert train.stream is not None and train.stream.plan.lanes == 2 and val.stream is not None  # auto: stream
    x, y = val.get_batch(np.arange(0, 9, 2), -1)
    # validation: the stored order cut into 2 lanes, rank 0's positions 0, 2, .. are the first half
    assert x.shape == (5, 32, 32, 3) and y.tolist() == val.labels_of(np.arange(5)).tolist() == [0, 0, 0, 1, 1]
    random = ImageConfig(size=32, workers=0, read="random", train_shards=f"{url}/{TARS}",
                         val_shards=f"{url}/wds/val/val-{{000000..000003}}.tar")
    train2, _, _ = opened(None, random, seed=3)
    assert train2.stream is None
    with pytest.raises(DataError, match=r"image.val_shards is not set: remote data \(http://.*/wds\) cannot be "
                                        r"searched"):
        opened(f"{url}/wds", ImageConfig(train_shards="train/train-{000000..000003}.tar"), seed=3)
    with pytest.raises(DataError, match=r"image.read=stream reads shards; .*/folder/train is an ImageFolder tree"):
        opened(base / "folder", ImageConfig(read="stream", workers=0), seed=3)
    listed, listed_val, _ = opened(f"{url}/conv", ImageConfig(size=32, workers=0), seed=3, world_size=2)
    assert (len(listed), len(listed_val), listed.index.kind, len(listed.index.shards)) == (24, 9, "row", 3)
    assert listed.stream is not None and listed.get_batch(np.arange(4), 0)[0].shape == (4, 32, 32, 3)
    for d in (train, val, listed, listed_val):
        d.stream.close()


@needs_photos
@needs_server
def test_missing_and_truncated_remote_shards_are_named_by_url(served):
    base, url = served
    with pytest.raises(DataError, match=rf"shard {url}/wds/train/train-000004.tar does not exist"):
        load_shard_index(remote.expand(f"{url}/wds/train/train-{{000000..000009}}.tar"), "webdataset")
    cut = base / "wds" / "cut"
    cut.mkdir(exist_ok=True)
    data = (base / "wds" / "train" / "train-000000.tar").read_bytes()
    (cut / "cut-0.tar").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"shard {url}/wds/cut/cut-0.tar (is truncated|is not a readable tar)"):
        load_shard_index([f"{url}/wds/cut/cut-0.tar"], "webdataset")
    with tarfile.open(cut / "nolabel.tar", "w") as tar:
        info = tarfile.TarInfo("k1.jpg")
        info.size = 3
        tar.addfile(info, fileobj=__import__("io").BytesIO(b"abc"))
    with pytest.raises(DataError, match=rf"shard {url}/wds/cut/nolabel.tar: sample 'k1' has no label"):
        load_shard_index([f"{url}/wds/cut/nolabel.tar"], "webdataset")


def test_remote_failures_name_the_url_and_are_never_taken_for_bad_images(monkeypatch):
    monkeypatch.setattr(remote, "ATTEMPTS", 2)
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}/wds/train-000000.tar"
    with pytest.raises(DataError, match=rf"shard {url} cannot be reached \(asking its size\): ClientConnectorError"):
        load_shard_index([url], "webdataset")
    with pytest.raises(remote.RemoteError, match=rf"shard {url} cannot be reached \(reading bytes 0-10\)"):
        remote.read_range(url, 0, 10)  # a sample's read: a RuntimeError, not one of the decoder's errors
    assert not issubclass(remote.RemoteError, (OSError, ValueError))


@needs_photos
@needs_server
def test_a_server_without_range_requests_is_read_correctly_and_named(served, capfd):
    base, _ = served
    port = free_port()
    plain = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=base,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/wds/train/train-000000.tar"
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        data = (base / "wds" / "train" / "train-000000.tar").read_bytes()
        assert remote.read_range(url, 1536, 700) == data[1536:2236]  # the whole file came: the span cut from it
        assert "ignores HTTP range requests" in capfd.readouterr().err
    finally:
        plain.terminate()
        plain.wait(timeout=10)
