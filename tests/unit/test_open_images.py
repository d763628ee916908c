"""``hvdtrain.data.open_images`` (issue 43, item 5): one public call opens image data in every local
layout it reads (an ImageFolder tree, a flat validation folder with a labels CSV, WebDataset tars,
Parquet, a ``save_to_disk`` Arrow folder) and gives the samples the recipe's old path gave: the
same classes, labels and pixels as the ImageFolder tree's datasets built from the index, the
transform policy and :class:`~hvdtrain.data.pipeline.ImageDataset` directly (what the recipe's
``load_image_folder`` did, before the call moved into the library). Remote layouts and streaming:
``tests/unit/test_image_stream.py`` through the same call."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import hvdtrain
import hvdtrain.data
from hvdtrain.data import DataError, ImageData, ImageOptions, open_images
from hvdtrain.data.convert import convert
from hvdtrain.data.index import load_index
from hvdtrain.data.pipeline import ImageDataset
from hvdtrain.data.transforms import choose_policy

CLASSES = ("ant", "bee", "cat")
SEED = 3

pytestmark = pytest.mark.usefixtures("private_index_cache")


def tree(root: Path, train: int = 5, val: int = 2) -> Path:
    """An ImageFolder tree of small RGB JPEGs and PNGs of different sizes (random pixels)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for cls in CLASSES:
            (root / split / cls).mkdir(parents=True)
            for i in range(count):
                h, w = rng.integers(20, 40, size=2)
                pixels = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), mode="RGB")
                pixels.save(root / split / cls / (f"{i}.jpg" if i % 2 else f"{i}.png"))
    return root


def flat_val(src: Path, root: Path) -> Path:
    """The tree with its validation split as one flat folder and a ``file,class`` CSV (ImageNet's layout)."""
    shutil.copytree(src / "train", root / "train")
    (root / "val").mkdir()
    rows = ["file,class"]
    for cls in CLASSES:
        for image in sorted((src / "val" / cls).iterdir()):
            name = f"{cls}_{image.name}"  # sorted by class, then file: the tree's order
            shutil.copy(image, root / "val" / name)
            rows.append(f"{name},{cls}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def arrow(src: Path, root: Path) -> Path:
    """A ``datasets`` ``save_to_disk`` folder (Arrow IPC stream files, ``state.json``, the
    ``huggingface`` schema metadata), written with pyarrow: splits ``train`` and ``validation``."""
    import pyarrow as pa

    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": list(CLASSES)}}
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    for split, name in (("train", "train"), ("val", "validation")):
        images, labels = [], []
        for label, cls in enumerate(CLASSES):
            for image in sorted((src / split / cls).iterdir()):
                images.append({"bytes": image.read_bytes(), "path": f"{cls}/{image.name}"})
                labels.append(label)
        table = pa.table({"image": images, "label": pa.array(labels, pa.int64())}).replace_schema_metadata(metadata)
        (root / name).mkdir(parents=True)
        with pa.OSFile(str(root / name / "data-00000-of-00001.arrow"), "wb") as sink, \
                pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=4)
        state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}
        (root / name / "state.json").write_text(json.dumps(state))
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "validation"]}))
    return root


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Every local layout, the same images in the same order: name -> (root, options, format)."""
    base = tmp_path_factory.mktemp("layouts")
    folder = tree(base / "folder")
    shards = {}
    for fmt in ("webdataset", "parquet"):  # hvdtrain convert, unshuffled: the tree's order
        convert(folder, base / fmt, fmt, samples_per_shard=4, shuffle_seed=None, cache=base / "cache")
        shards[fmt] = base / fmt
    return {
        "folder": (folder, {}, "folder"),
        "flat val with labels": (flat_val(folder, base / "flat"), {"val_labels": str(base / "flat" / "labels.csv")},
                                 "folder"),
        "webdataset": (shards["webdataset"], {}, "webdataset"),
        "parquet": (shards["parquet"], {}, "parquet"),
        "arrow": (arrow(folder, base / "arrow"), {}, "arrow"),
    }


def reference(root: Path, seed: int) -> tuple[ImageDataset, ImageDataset]:
    """The tree's datasets as the recipe built them before the call: index, policy, ImageDataset."""
    train_index, val_index = load_index(root / "train"), load_index(root / "val")
    policy = choose_policy("auto", 16, train_index.native_size, None, train_index.grayscale)
    common = dict(seed=seed, grayscale=train_index.grayscale)
    return (ImageDataset(train_index, policy, train=True, name="train", **common),
            ImageDataset(val_index, policy, train=False, name="val", **common))


def same_samples(got: ImageDataset, want: ImageDataset, epochs: tuple[int, ...]) -> None:
    assert len(got) == len(want)
    every = np.arange(len(want))
    for epoch in epochs:
        (x, y), (wx, wy) = got.get_batch(every, epoch), want.get_batch(every, epoch)
        assert np.array_equal(y, wy), epoch
        assert np.array_equal(x, wx), epoch  # bitwise: the random crops and flips from (seed, epoch, sample)


@pytest.mark.parametrize("layout", ["folder", "flat val with labels", "webdataset", "parquet", "arrow"])
def test_every_local_layout_gives_the_tree_s_samples(layouts, layout):
    root, options, fmt = layouts[layout]
    data = open_images(root, ImageOptions(size=16, workers=0, **options), seed=SEED)
    assert isinstance(data, ImageData) and data.format == fmt and data.classes == list(CLASSES)
    assert data.workers == 0 and data.train.stream is None and data.val.stream is None  # local: read at random
    train, val = reference(layouts["folder"][0], SEED)
    same_samples(data.train, train, epochs=(0, 1))
    same_samples(data.val, val, epochs=(-1, 0))  # validation: never augmented
    assert data.describe().startswith("15 train / 6 val files in 3 classes (index built:")
    assert data.describe().endswith("no decoding worker(s) per rank")


def test_caps_format_and_shard_patterns_are_honoured(layouts):
    root, _, _ = layouts["webdataset"]
    options = ImageOptions(size=16, workers=0, format="webdataset", train_shards="train-{000000..000003}.tar",
                           val_shards="val-*.tar")
    data = open_images(root, options, seed=SEED, max_train=7, max_val=4)
    assert (len(data.train), len(data.val), data.format) == (7, 4, "webdataset")
    again = open_images(layouts["folder"][0], ImageOptions(size=16, workers=0), seed=SEED, max_train=7, max_val=4)
    np.testing.assert_array_equal(data.train.rows, again.train.rows)  # the same seeded subset in every layout
    np.testing.assert_array_equal(data.train.get_batch(np.arange(7), 0)[0], again.train.get_batch(np.arange(7), 0)[0])


def test_without_a_root_the_shard_patterns_locate_the_data(layouts, monkeypatch):
    root, _, _ = layouts["parquet"]
    named = ImageOptions(size=16, workers=0, train_shards=str(root / "data" / "train-*.parquet"),
                         val_shards=str(root / "data" / "val-*.parquet"))
    monkeypatch.chdir(root / "data")  # relative patterns: from the current folder
    for options in (named, ImageOptions(size=16, workers=0, train_shards="train-*.parquet", val_shards="val-*.parquet")):
        data = open_images(None, options, seed=SEED)
        assert (data.format, len(data.train), len(data.val), data.classes) == ("parquet", 15, 6, list(CLASSES))
    with pytest.raises(DataError, match="image.format=folder: an ImageFolder tree needs its folder"):
        open_images(None, ImageOptions(format="folder", train_shards="train-*.parquet"))


def test_the_call_is_public():
    assert hvdtrain.open_images is hvdtrain.data.open_images is open_images
    assert hvdtrain.ImageOptions is hvdtrain.data.ImageOptions
    from hvdtrain_recipes.image_classification.config import ImageConfig

    assert ImageConfig is ImageOptions  # the recipe's image section is the call's options, as they are
    assert open_images.__doc__ and all(name in open_images.__doc__ for name in
                                       ("folder", "val_labels", "webdataset", "parquet", "arrow", "URL", "stream"))


def test_bad_input_is_one_line_naming_it(tmp_path, layouts):
    cases = [
        (tmp_path / "nope", ImageOptions(), f"data directory {tmp_path / 'nope'} does not exist"),
        (layouts["folder"][0], ImageOptions(format="tiff"), "image.format='tiff' is not one of auto, folder, "
                                                            "webdataset, parquet, arrow"),
        (layouts["folder"][0], ImageOptions(read="sometimes"), "image.read='sometimes' is not one of auto, random, "
                                                               "stream"),
        (None, ImageOptions(), "no image data given: name its folder or URL (--data), or its shards "
                               "(image.train_shards)"),
        (layouts["folder"][0], ImageOptions(read="stream", workers=0), "image.read=stream reads shards"),
    ]
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    cases.append((tmp_path / "empty", ImageOptions(), "holds no dataset layout hvdtrain knows"))
    for root, options, message in cases:
        with pytest.raises(DataError) as err:
            open_images(root, options)
        assert message in str(err.value) and "\n" not in str(err.value), (root, options, str(err.value))


def test_elastic_streaming_without_fixed_lanes_is_refused_before_any_spool(layouts, tmp_path):
    root, _, _ = layouts["webdataset"]
    with pytest.raises(DataError, match=r"train.elastic=true streams the shards .* set image.stream_lanes"):
        open_images(root, ImageOptions(workers=0, read="stream", spool_dir=str(tmp_path / "spool")), elastic=True)
    assert not (tmp_path / "spool").exists()
    data = open_images(root, ImageOptions(size=16, workers=0, read="stream", stream_lanes=2,
                                          spool_dir=str(tmp_path / "spool")), elastic=True, seed=SEED)
    try:
        assert data.train.stream.plan.lanes == 2
        assert "in 2 lane(s), spool of up to 4 shards / 2048 MiB per rank" in data.describe()
    finally:
        data.train.stream.close()
        data.val.stream.close()
