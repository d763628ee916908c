"""The image-classification recipe's data layer on the framework-free pipeline (no framework needed),
and the decoder: JPEGs through libjpeg-turbo's DCT scaling + OpenCV's bit-exact resize, checked on
real photos against a full decode + crop + resize; other formats through Pillow."""

import io
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from benchmarks import photo_tree
from hvdtrain.data.decode import DECODE_ERRORS, decode
from hvdtrain.data.index import load_index
from hvdtrain.data.transforms import SampleOp, TransformPolicy
from hvdtrain.data import DataError, open_images
from hvdtrain.data import ImageOptions as ImageConfig


def opened(*args, **kwargs):
    """Train, val and classes of :func:`hvdtrain.data.open_images`."""
    data = open_images(*args, **kwargs)
    return data.train, data.val, data.classes


def write_tree(root, classes, per_class=3, mode="L", size=(12, 10), splits=("train", "val")):
    rng = np.random.default_rng(0)
    for split in splits:
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                shape = (size[1], size[0]) if mode == "L" else (size[1], size[0], 3)
                Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode=mode).save(
                    root / split / cls / f"{i}.png")
    return root


pytestmark = pytest.mark.usefixtures("private_index_cache")


def load(root, seed=0, **image):
    return opened(root, ImageConfig(**{"workers": 0, **image}), seed=seed)


def test_index_labels_sorted_classes(tmp_path):
    write_tree(tmp_path, ["b", "a"], per_class=2)
    index = load_index(tmp_path / "train")
    assert index.classes == ["a", "b"]
    assert [index.relpath(i) for i in range(4)] == ["a/0.png", "a/1.png", "b/0.png", "b/1.png"]
    assert index.labels.tolist() == [0, 0, 1, 1]


def test_grayscale_uint8_batches_at_native_size(tmp_path):
    write_tree(tmp_path, ["0", "1"], size=(12, 12))
    train, val, classes = load(tmp_path)
    assert classes == ["0", "1"] and train.grayscale and not train.policy.augment
    assert train.policy.kind == "pad-crop" and train.policy.size == 12
    x, y = train.get_batch(np.array([0, 4]), epoch=0)
    assert x.shape == (2, 12, 12, 1) and x.dtype == np.uint8 and y.tolist() == [0, 1]
    original = np.asarray(Image.open(tmp_path / "train" / "0" / "0.png"))
    np.testing.assert_array_equal(x[0, :, :, 0], original)  # no augmentation, no resize: the pixels


def test_rgb_resize_and_deterministic_augmentation(tmp_path):
    write_tree(tmp_path, ["cat", "dog"], mode="RGB", size=(20, 20))
    train, val, _ = load(tmp_path, size=16, seed=3)
    assert train.policy.augment and train.train and not val.train
    a, _ = train.get_batch(np.arange(4), epoch=1)
    b, _ = train.get_batch(np.arange(4), epoch=1)
    c, _ = train.get_batch(np.arange(4), epoch=2)
    assert a.shape == (4, 16, 16, 3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_caps_take_a_seeded_subset_of_all_classes(tmp_path):
    write_tree(tmp_path, [str(i) for i in range(5)], per_class=10)
    train, val, _ = opened(tmp_path, ImageConfig(workers=0), seed=1, max_train=20, max_val=7)
    assert len(train) == 20 and len(val) == 7
    assert len(set(train.labels_of(np.arange(20)).tolist())) > 2  # not just the first classes
    again, _, _ = opened(tmp_path, ImageConfig(workers=0), seed=1, max_train=20)
    np.testing.assert_array_equal(again.rows, train.rows)


def test_index_is_cached_and_rebuilt_when_the_tree_changes(tmp_path):
    write_tree(tmp_path, ["a", "b"])
    assert load_index(tmp_path / "train").built
    assert not load_index(tmp_path / "train").built  # read from the cache
    Image.new("L", (12, 10)).save(tmp_path / "train" / "a" / "new.png")
    again = load_index(tmp_path / "train")
    assert again.built and len(again) == 7


@pytest.mark.parametrize("break_tree,needle", [
    (lambda root: (root / "val" / "b").rename(root / "val" / "c"), "only in train: ['b']; only in val: ['c']"),
    (lambda root: [p.unlink() for p in (root / "train" / "a").iterdir()], "holds no images"),
    (lambda root: shutil.rmtree(root / "val"), "does not exist"),
])
def test_bad_trees_are_named(tmp_path, break_tree, needle):
    write_tree(tmp_path / "d", ["a", "b"])
    break_tree(tmp_path / "d")
    with pytest.raises(DataError) as err:
        load(tmp_path / "d")
    assert needle in str(err.value)


def test_missing_root(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load(tmp_path / "nope")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three real-photo JPEGs of about 500x375 (scikit-image's photographs)."""
    if not photo_tree.available() and os.environ.get("CI") != "true":
        pytest.skip("scikit-image's photos are not installed (scripts/install.sh adds scikit-image==0.26.0)")
    root = photo_tree.make_tree(tmp_path_factory.mktemp("photos"), classes=3, train=1, val=0, size=(500, 375))
    return sorted(root.glob("train/*/*.JPEG"))


def reference(path, box, size, flip, grayscale):
    """Pillow: full decode, the crop box resized (antialiased bilinear), maybe flipped."""
    left, top, w, h = box
    with Image.open(path) as img:
        out = np.asarray(img.convert("L" if grayscale else "RGB").resize(
            (size, size), Image.BILINEAR, box=(left, top, left + w, top + h)), dtype=np.float64)
    out = out[:, :, None] if grayscale else out
    return out[:, ::-1] if flip else out


# (box, output size): upscaled, 1:1, shrunk < 2x (full decode), and DCT-scaled by 1/2, 1/4, 1/8
CASES = [((10, 20, 60, 80), 224), ((100, 50, 224, 224), 224), ((20, 30, 330, 300), 224),
         ((150, 60, 300, 250), 112), ((0, 0, 375, 375), 64), ((60, 0, 375, 375), 32)]


@pytest.mark.parametrize("grayscale", [False, True])
def test_jpeg_crops_the_right_region_at_every_dct_scale(photos, grayscale):
    for path in photos:
        with Image.open(path) as img:
            width, height = img.size  # 500x375 or 375x500
        for (left, top, w, h), size in CASES:
            w, h = min(w, width), min(h, height)
            box = (min(left, width - w), min(top, height - h), w, h)
            out = decode(path, TransformPolicy("imagenet", size), lambda width, height: SampleOp(box, True), grayscale)
            assert out.dtype == np.uint8 and out.shape == (size, size, 1 if grayscale else 3)
            error = np.abs(out - reference(path, box, size, True, grayscale)).mean()
            shift = max(4, min(w, h) // 8)  # move the crop right, else left, else down
            moved = ((box[0] + shift, box[1]) if box[0] + w + shift <= width else (box[0] - shift, box[1])
                     if box[0] >= shift else (box[0], box[1] + shift)) + (w, h)
            wrong = np.abs(out - reference(path, moved, size, True, grayscale)).mean()
            # measured: error 0.0-1.2 where no DCT scaling applies (the antialiasing of a < 2x shrink), up to
            # 9.3 where it does (at 32-112 pixels, the box is also rounded to whole pixels of the scaled
            # image); a crop moved by 1/8 of its side: 17-59
            assert error < (10 if min(w, h) >= 2 * size else 3) and error < wrong / 2, (path, box, size, error, wrong)


def test_decoding_is_deterministic_from_path_bytes_or_file(photos):
    policy = TransformPolicy("imagenet", 96)
    data = photos[0].read_bytes()
    outs = [decode(source, policy, lambda w, h: SampleOp((33, 21, 301, 255), False), False)
            for source in (photos[0], str(photos[0]), data, io.BytesIO(data), data)]
    assert all(np.array_equal(outs[0], out) for out in outs[1:])


def test_png_and_cmyk_jpeg_take_pillow(photos, tmp_path):
    policy, box = TransformPolicy("imagenet", 64), (40, 30, 300, 280)
    with Image.open(photos[1]) as img:
        rgb = img.convert("RGB")
    rgb.save(tmp_path / "p.png")
    rgb.convert("CMYK").save(tmp_path / "c.jpg", quality=95)
    png = decode(tmp_path / "p.png", policy, lambda w, h: SampleOp(box, False), False)
    assert np.array_equal(png, reference(tmp_path / "p.png", box, 64, False, False))  # Pillow's resize, exactly
    cmyk = decode(tmp_path / "c.jpg", policy, lambda w, h: SampleOp(box, False), False)
    error = np.abs(cmyk - reference(tmp_path / "c.jpg", box, 64, False, False)).mean()
    assert cmyk.shape == (64, 64, 3) and error < 3, error  # Pillow's DCT scaling (draft), then its resize


def test_broken_jpegs_raise_a_decode_error(photos):
    data = photos[0].read_bytes()
    for broken in (data[:300], data[:len(data) // 2], b"\xff\xd8\xff" + bytes(50)):
        with pytest.raises(DECODE_ERRORS):
            decode(broken, TransformPolicy("imagenet", 32), lambda w, h: SampleOp(None, False), False)
