"""The image-classification recipe's data layer on the framework-free pipeline (no framework needed)."""

import shutil

import numpy as np
import pytest
from PIL import Image

from hvdtrain.data.index import load_index
from recipes.image_classification.config import ImageConfig
from recipes.image_classification.data import DataError, load_image_folder


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
    return load_image_folder(root, ImageConfig(**{"workers": 0, **image}), seed=seed)


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
    train, val, _ = load_image_folder(tmp_path, ImageConfig(workers=0), seed=1, max_train=20, max_val=7)
    assert len(train) == 20 and len(val) == 7
    assert len(set(train.labels_of(np.arange(20)).tolist())) > 2  # not just the first classes
    again, _, _ = load_image_folder(tmp_path, ImageConfig(workers=0), seed=1, max_train=20)
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
