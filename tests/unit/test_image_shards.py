"""Image datasets stored as shards (issue 25, item 1): WebDataset tars, Hugging Face Parquet and a
``datasets`` ``save_to_disk`` folder, each written by its real producer from the same small tree of
real-photo JPEGs, give batches bitwise identical to the ImageFolder tree's (same seed, random
crops, with and without worker processes); the per-host index is reused and rebuilt when a shard
changes; bad shards and samples are named; brace patterns expand."""

from __future__ import annotations

import importlib.util
import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks import photo_tree
from hvdtrain.core import sharding
from hvdtrain.data import braces
from hvdtrain.data.index import DataError
from hvdtrain.data.shards import load_shard_index
from hvdtrain.data.workers import WorkerPool
from hvdtrain.data import ImageOptions as ImageConfig
from hvdtrain.data import open_images

if not photo_tree.available() and os.environ.get("CI") != "true":
    pytest.skip("scikit-image's photos are not installed (scripts/install.sh adds scikit-image==0.26.0)",
                allow_module_level=True)

STORES = Path(__file__).resolve().parents[1] / "distributed" / "workers" / "image_stores.py"
_spec = importlib.util.spec_from_file_location("image_stores", STORES)
image_stores = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(image_stores)
samples, write_tars, write_parquet, write_arrow = (image_stores.samples, image_stores.write_tars,
                                                   image_stores.write_parquet, image_stores.write_arrow)
webdataset = image_stores.webdataset


def opened(*args, **kwargs):
    """Train, val and classes of :func:`hvdtrain.data.open_images`."""
    data = open_images(*args, **kwargs)
    return data.train, data.val, data.classes


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("stores")
    tree = photo_tree.make_tree(base / "folder", classes=3, train=8, val=3, size=(120, 90))
    return {"folder": tree, "webdataset": write_tars(tree, base / "wds"), "parquet": write_parquet(tree, base / "pq"),
            "arrow": write_arrow(tree, base / "arrow")}


pytestmark = pytest.mark.usefixtures("private_index_cache")


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(2)
    yield pool
    pool.close()


def load(root, pool=None, **image):
    return opened(root, ImageConfig(**{"size": 32, "workers": 0, **image}), seed=3, pool=pool)


@pytest.mark.parametrize("fmt", ["webdataset", "parquet", "arrow"])
def test_shards_give_the_image_folders_batches_bitwise(stores, pool, fmt):
    folder_train, folder_val, classes = load(stores["folder"])
    train, val, shard_classes = load(stores[fmt])  # the format is detected from the layout
    pooled, _, _ = load(stores[fmt], pool)
    assert shard_classes == classes and len(train) == len(folder_train) == 24 and len(val) == 9
    assert train.index.kind == {"webdataset": "span", "parquet": "row", "arrow": "span"}[fmt]
    assert train.policy.kind == "imagenet"  # 120x90 photos: RandomResizedCrop
    for epoch in (0, 1):
        for batch in sharding.batches(sharding.train_shard(len(train), 0, 1, epoch, seed=3), 7):
            a, la = folder_train.get_batch(batch, epoch)
            b, lb = train.get_batch(batch, epoch)
            c, lc = pooled.get_batch(batch, epoch)
            assert np.array_equal(a, b) and np.array_equal(a, c)
            assert np.array_equal(la, lb) and np.array_equal(la, lc)
    everything = np.arange(len(val))
    assert np.array_equal(folder_val.get_batch(everything, -1)[0], val.get_batch(everything, -1)[0])
    assert np.array_equal(folder_val.labels_of(everything), val.labels_of(everything))
    assert train.index.nbytes <= 100 * len(train)
    reader = train.index.reader()
    assert reader.read(5) == (stores["folder"] / "train" / classes[0] / "00005.JPEG").read_bytes()


def test_json_labels_by_class_name_and_explicit_shard_patterns(stores, tmp_path):
    root = write_tars(stores["folder"], tmp_path / "json", label="json")
    (root / "manifest.json").unlink()  # class names: the ones found, sorted
    train, val, classes = load(tmp_path, format="webdataset", train_shards="json/train/train-{000000..000001}.tar",
                               val_shards="json/val/*.tar")
    folder, _, folder_classes = load(stores["folder"])
    assert classes == folder_classes and len(train) == 24
    assert np.array_equal(train.labels_of(np.arange(24)), folder.labels_of(np.arange(24)))


def test_index_is_reused_and_rebuilt_when_a_shard_changes(stores, tmp_path):
    shards = sorted((stores["webdataset"] / "train").glob("*.tar"))
    first = load_shard_index(shards, "webdataset")
    again = load_shard_index(shards, "webdataset")
    assert first.built and not again.built and again.cache_dir == first.cache_dir
    copies = []
    for shard in shards:
        copies.append(tmp_path / shard.name)
        copies[-1].write_bytes(shard.read_bytes())
    (tmp_path / "manifest.json").write_bytes((stores["webdataset"] / "manifest.json").read_bytes())
    assert load_shard_index(copies, "webdataset").digest == first.digest  # the same data elsewhere
    jpeg = samples(stores["folder"], "train")[0][2]
    with tarfile.open(copies[1], "a") as tar:  # one more sample appended to a shard
        for name, data in (("extra.jpg", jpeg), ("extra.cls", b"0")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    rebuilt = load_shard_index(copies, "webdataset")
    assert rebuilt.built and len(rebuilt) == len(first) + 1


def test_truncated_shard_names_the_shard_and_member(stores, tmp_path):
    shard = tmp_path / "train-000000.tar"
    data = (stores["webdataset"] / "train" / "train-000000.tar").read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    with pytest.raises(DataError) as err:
        load_shard_index([shard], "webdataset")
    message = str(err.value)
    assert str(shard) in message and "truncated" in message and ".jpg" in message


def test_sample_without_label_is_named(stores, tmp_path):
    shard = tmp_path / "s.tar"
    with webdataset.TarWriter(str(shard)) as sink:
        key, _, data = samples(stores["folder"], "train")[0]
        sink.write({"__key__": "good", "jpg": data, "cls": 0})
        sink.write({"__key__": key, "jpg": data})
    with pytest.raises(DataError, match=f"shard {shard}: sample '{key}' has no label"):
        load_shard_index([shard], "webdataset")


def test_undecodable_image_is_named_by_shard_and_key_or_skipped(stores, tmp_path, pool):
    root = tmp_path / "bad"
    for split in ("train", "val"):
        (root / split).mkdir(parents=True)
        with webdataset.TarWriter(str(root / split / "s-0.tar")) as sink:
            for i, (key, _, data) in enumerate(samples(stores["folder"], split)[:6]):
                sink.write({"__key__": key, "jpg": data[:300] if i == 2 else data, "cls": i % 2})
    train, _, _ = load(root, pool)
    bad_key = samples(stores["folder"], "train")[2][0]
    with pytest.raises(DataError) as err:
        train.get_batch(np.arange(6), 0)
    assert f"{root / 'train' / 's-0.tar'} sample '{bad_key}'" in str(err.value)
    assert "image.bad_files=skip" in str(err.value)
    skipping, _, _ = load(root, pool, bad_files="skip")
    inline, _, _ = load(root, bad_files="skip")
    a, la = skipping.get_batch(np.arange(6), 0)
    b, lb = inline.get_batch(np.arange(6), 0)
    assert np.array_equal(a, b) and np.array_equal(la, lb) and a.shape[0] == 6


def test_columns_are_checked_and_named(stores):
    with pytest.raises(DataError, match="no column image.image_column='picture'; its columns: image, label"):
        load(stores["parquet"], image_column="picture")
    with pytest.raises(DataError, match="no column image.label_column='y'; its columns: image, label"):
        load(stores["arrow"], label_column="y")
    files = sorted((stores["parquet"] / "data").glob("train-*.parquet"))
    import pyarrow.parquet as pq

    table = pq.read_table(files[0]).rename_columns(["picture_bytes", "label"])
    other = files[0].parent.parent.parent / "renamed.parquet"
    pq.write_table(table, other)
    with pytest.raises(DataError, match="has no image column .* its columns: picture_bytes, label"):
        load_shard_index([other], "parquet")
    assert len(load_shard_index([other], "parquet", image_column="picture_bytes")) == 12


def test_empty_patterns_and_unknown_layouts_are_named(stores, tmp_path):
    with pytest.raises(DataError, match=r"image.train_shards=train/train-\{000000..000005\}.tar: shard .*000002.tar "
                                        r"\(from .*\) does not exist; .* holds: train-000000.tar, train-000001.tar"):
        load(stores["webdataset"], train_shards="train/train-{000000..000005}.tar")
    with pytest.raises(DataError, match=r"no file matches .*nope-\*.tar"):
        load(stores["webdataset"], train_shards="nope-*.tar")
    (tmp_path / "stuff.txt").write_text("x")
    with pytest.raises(DataError, match="holds no dataset layout .* it holds: stuff.txt"):
        load(tmp_path)


def test_brace_expansion():
    assert braces.expand("train-{000000..000002}.tar") == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert braces.expand("{a,b}-{8..10}") == ["a-8", "a-9", "a-10", "b-8", "b-9", "b-10"]
    assert braces.expand("s{0..4..2}") == ["s0", "s2", "s4"]
    assert braces.expand("x-{0..1}-{us,{eu,ap}}") == ["x-0-us", "x-0-eu", "x-0-ap", "x-1-us", "x-1-eu", "x-1-ap"]
    assert braces.expand("plain{}.tar") == ["plain{}.tar"] and braces.expand("{solo}") == ["{solo}"]
    assert len(braces.expand("imagenet-train-{000000..001023}.tar")) == 1024


def test_pax_and_long_member_names_are_read_through_tarfile(stores, tmp_path):
    """Names over 100 bytes or not ASCII get pax headers: the fast header scan hands them to tarfile."""
    shard = tmp_path / "long.tar"
    rows = samples(stores["folder"], "train")[:3]
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        for i, (key, _, data) in enumerate(rows):
            key = ("d" * 120 + "/" if i == 1 else "") + key + ("-café" if i == 2 else "")
            for ext, payload in (("jpg", data), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    index = load_shard_index([shard], "webdataset")
    assert index.labels.tolist() == [0, 1, 2] and index.relpath(2).endswith("-café")
    assert [index.reader().read(i) for i in range(3)] == [data for _, _, data in rows]
