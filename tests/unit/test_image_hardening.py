"""Image trees as users bring them (issue 22, item 8 and the index's publication): the colour mode
and size are decided from a sample of the training tree and kept for validation; 16-bit files are
scaled, not clipped, and float files scaled from [0, 1] (issue 63); only the documented formats
are opened; oversized and non-UTF-8-named files are named or handled; a rebuilt index never
changes under a live job, and two copies of a tree give the same fingerprint."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from hvdtrain.data.index import DataError, load_index
from hvdtrain.data import ImageOptions as ImageConfig
from hvdtrain.data import open_images

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.usefixtures("private_index_cache")


def opened(*args, **kwargs):
    """Train, val and classes of :func:`hvdtrain.data.open_images`."""
    data = open_images(*args, **kwargs)
    return data.train, data.val, data.classes


def image(path, mode="RGB", size=(40, 40), seed=0, fmt=None):
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0]) if mode == "L" else (size[1], size[0], 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode=mode).save(path, format=fmt)
    return path


def tree(root, classes=("a", "b"), per_class=4, splits=("train", "val"), **kwargs):
    for split in splits:
        for c in classes:
            for i in range(per_class):
                image(root / split / c / f"{i}.png", seed=i, **kwargs)
    return root


def load(root, **kwargs):
    return opened(root, ImageConfig(**{"workers": 0, **kwargs}), seed=0)


def test_grayscale_validation_images_get_the_training_images_channels(tmp_path):
    tree(tmp_path, splits=("train",))  # RGB training images
    tree(tmp_path, splits=("val",), mode="L")  # validation saved in grayscale (first image included)
    train, val, _ = load(tmp_path)
    x, _ = val.get_batch(np.arange(len(val)), -1)
    assert train.channels == val.channels == 3 and x.shape[-1] == 3  # was 1: the model failed after an epoch


def test_one_grayscale_or_thumbnail_first_file_does_not_decide_the_run(tmp_path):
    tree(tmp_path, size=(120, 90))
    image(tmp_path / "train" / "a" / "0.png", mode="L", size=(16, 16))  # the first file: a gray thumbnail
    train, val, _ = load(tmp_path)
    assert not train.grayscale and train.channels == 3
    assert train.policy.kind == "imagenet" and train.policy.size == 224  # was pad-crop at 16 (small_cnn)
    x, _ = train.get_batch(np.arange(2), 0)
    assert x.shape == (2, 224, 224, 3)


@pytest.mark.parametrize("suffix", ["png", "tif"])
def test_16_bit_images_are_scaled_not_clipped(tmp_path, suffix):
    values = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000)
    for c in ("a", "b"):
        for split in ("train", "val"):
            (tmp_path / split / c).mkdir(parents=True)
            Image.fromarray(values).save(tmp_path / split / c / f"0.{suffix}")
    train, _, _ = load(tmp_path)
    assert train.grayscale and train.policy.size == 8
    x, _ = train.get_batch(np.arange(1), -1)
    expected = (values.astype(np.int64) * 255 + 32767) // 65535
    np.testing.assert_array_equal(x[0, :, :, 0], expected)  # was 255 (white) from 1000 on


def float_tree(root, values):
    """A tree of 32-bit float TIFFs written by Pillow (mode F): ``values`` in every file."""
    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            Image.fromarray(values).save(root / split / c / "0.tif")
    assert Image.open(root / "train" / "a" / "0.tif").mode == "F"
    return root


def test_float_images_in_0_1_are_scaled_in_training_and_predict(tmp_path):
    """Issue 63, item 10: Pillow's convert clipped mode F, so [0, 1] decoded black (predict: "dark
    1.0000" for a light image)."""
    from hvdtrain_recipes.image_classification.predict import load_images

    values = np.linspace(0.5, 1.0, 64, dtype=np.float32).reshape(8, 8)  # a light image
    float_tree(tmp_path, values)
    expected = np.rint(values * 255).astype(np.uint8)
    train, _, _ = load(tmp_path)
    assert train.grayscale and train.policy.size == 8
    x, _ = train.get_batch(np.arange(1), -1)
    np.testing.assert_array_equal(x[0, :, :, 0], expected)  # was 0 (or 1) everywhere
    record = {"transform": "resize", "size": 8, "val_crop": 1.0, "grayscale": True}
    predicted = load_images([str(tmp_path / "val" / "a" / "0.tif")], record)
    np.testing.assert_array_equal(predicted[0, :, :, 0], expected)  # the same decoder as training


def test_a_float_image_outside_0_1_is_refused_naming_its_range(tmp_path):
    float_tree(tmp_path, np.linspace(0, 200, 64, dtype=np.float32).reshape(8, 8))
    train, _, _ = load(tmp_path)
    with pytest.raises(DataError) as err:  # was: clipped at 255 without a word
        train.get_batch(np.arange(1), -1)
    assert "0.tif" in str(err.value) and "float image with values in [0, 200]" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fmt", ["PCX", "TGA", "EPS"])
def test_only_the_documented_formats_are_opened(tmp_path, fmt):
    """Hypothesis b of issue 63: Pillow opened every format it knows (EPS through Ghostscript where
    installed), whatever the file's name; now only JPEG, PNG, BMP, GIF, WebP, TIFF and PPM."""
    tree(tmp_path, per_class=2)
    bad = tmp_path / "train" / "a" / "1.png"
    Image.fromarray(np.full((40, 40, 3), 90, np.uint8)).save(bad, format=fmt)  # a .png that is not one
    train, _, _ = load(tmp_path)
    order = [train.index.relpath(i) for i in range(len(train))]
    with pytest.raises(DataError) as err:  # was: decoded (PCX, TGA) or handed to Ghostscript (EPS)
        train.get_batch(np.asarray([order.index("a/1.png")]), -1)
    assert str(bad) in str(err.value) and "not an image in a format read here (JPEG, PNG" in str(err.value)


def test_decompression_bomb_in_the_sample_is_a_data_error(tmp_path, monkeypatch):
    tree(tmp_path, size=(50, 50))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 2500 px > 2 x 1000: Pillow's DecompressionBombError
    with pytest.raises(DataError) as err:  # was the DecompressionBombError's traceback
        load_index(tmp_path / "train")
    assert str(tmp_path / "train") in str(err.value) and "pixels" in str(err.value)


def test_images_between_one_and_two_bounds_are_not_decoded_whole(tmp_path, monkeypatch):
    tree(tmp_path, size=(40, 40))
    big = image(tmp_path / "train" / "b" / "9.png", size=(110, 110))  # 12,100 px: Pillow only warns
    photo = image(tmp_path / "train" / "b" / "8.jpg", size=(110, 110), fmt="JPEG")  # decodable at 1/4 scale
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    train, _, _ = load(tmp_path, size=16, transform="imagenet")
    order = [train.index.relpath(i) for i in range(len(train))]
    x, _ = train.get_batch(np.asarray([order.index("b/8.jpg")]), -1)  # the JPEG's DCT scaling keeps it small
    assert x.shape == (1, 16, 16, 3)
    with pytest.raises(DataError) as err:  # was decoded whole (the bound of 1 x MAX_IMAGE_PIXELS not applied)
        train.get_batch(np.asarray([order.index("b/9.png")]), -1)
    assert str(big) in str(err.value) and "Mpx" in str(err.value) and photo.exists()


def test_file_names_that_are_not_utf8(tmp_path):
    tree(tmp_path)
    name = os.path.join(os.fsencode(tmp_path / "train" / "a"), b"caf\xe9.png")
    Image.new("RGB", (40, 40), (200, 10, 10)).save(open(name, "wb"), format="PNG")
    train, _, _ = load(tmp_path)  # was UnicodeEncodeError
    order = [train.index.relpath(i) for i in range(len(train))]
    position = order.index(os.fsdecode(b"a/caf\xe9.png"))
    x, y = train.get_batch(np.asarray([position]), -1)
    assert y.tolist() == [0] and x[0, 20, 20].tolist() == [200, 10, 10]


def _paths(source):
    copy = pickle.loads(pickle.dumps(source))  # what a decoding worker gets: it maps the index lazily, by path
    return [str(copy._path(i)) for i in range(source.count)]


def test_a_rebuilt_index_never_changes_under_a_live_job(tmp_path):
    tree(tmp_path)
    train, _, _ = load(tmp_path)
    before = _paths(train.source)
    image(tmp_path / "train" / "a" / "00-new.png")  # the tree changes; another job on the host rebuilds
    code = ("from hvdtrain.data.index import load_index; import sys; "
            "assert len(load_index(sys.argv[1])) == 9")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "train")], check=True, cwd=REPO)
    assert _paths(train.source) == before  # was: the new paths under the old labels
    assert len(load_index(tmp_path / "train")) == 9


def test_unused_entries_are_pruned_and_copies_agree(tmp_path):
    tree(tmp_path / "one")
    code = "from hvdtrain.data.index import load_index; import sys; load_index(sys.argv[1])"
    build = lambda: subprocess.run([sys.executable, "-c", code, str(tmp_path / "one" / "train")],  # noqa: E731
                                   check=True, cwd=REPO)
    build()
    image(tmp_path / "one" / "train" / "b" / "new.png")
    build()  # the first entry is held by no process: removed
    slot = [p for p in (tmp_path / "cache" / "index").iterdir() if p.is_dir()]
    assert len(slot) == 1 and len([p for p in slot[0].iterdir() if p.is_dir()]) == 1
    tree(tmp_path / "two")
    image(tmp_path / "two" / "train" / "b" / "new.png")
    one, _, _ = load(tmp_path / "one")
    two, _, _ = load(tmp_path / "two")
    assert one.fingerprint() == two.fingerprint()  # the same files elsewhere: the same data
    (tmp_path / "two" / "train" / "b" / "new.png").rename(tmp_path / "two" / "train" / "a" / "new.png")
    moved, _, _ = load(tmp_path / "two")
    assert len(moved) == len(one) and moved.fingerprint() != one.fingerprint()  # same count, other labels


def test_a_flat_validation_folder_with_names_that_are_not_utf8(tmp_path):
    tree(tmp_path, splits=("train",))
    (tmp_path / "val").mkdir()
    for stem, cls in ((b"caf\xe9", "b"), (b"plain", "a")):
        Image.new("RGB", (40, 40)).save(open(os.path.join(os.fsencode(tmp_path / "val"), stem + b".png"), "wb"),
                                        format="PNG")
    labels = tmp_path / "labels.csv"
    labels.write_bytes(b"file,class\ncaf\xe9.png,b\nplain.png,a\n")  # a Latin-1 labels file, as the names are
    _, val, _ = load(tmp_path, val_labels=str(labels))
    names = [val.index.relpath(i) for i in range(len(val))]
    assert val.labels_of(np.arange(2)).tolist() == [1 if n == os.fsdecode(b"caf\xe9.png") else 0 for n in names]
