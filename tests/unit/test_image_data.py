"""The image-classification recipe's data layer (Pillow + NumPy; no framework needed)."""

import shutil

import numpy as np
import pytest
from PIL import Image

from recipes.image_classification.data import DataError, load_image_folder, scan_split


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


def test_scan_split_labels_sorted_classes(tmp_path):
    write_tree(tmp_path, ["b", "a"], per_class=2)
    classes, files, labels = scan_split(tmp_path / "train")
    assert classes == ["a", "b"]
    assert [f.parent.name for f in files] == ["a", "a", "b", "b"]
    assert labels.tolist() == [0, 0, 1, 1]


def test_grayscale_batch_shapes_and_normalisation(tmp_path):
    write_tree(tmp_path, ["0", "1"])
    train, val, classes = load_image_folder(tmp_path, image_size=None, augment=None, channels_first=True, seed=0)
    assert classes == ["0", "1"] and train.grayscale and not train.augment
    x, y = train.get_batch(np.array([0, 4]), epoch=0)
    assert x.shape == (2, 1, 10, 12) and x.dtype == np.float32 and y.tolist() == [0, 1]
    assert -1.0 <= x.min() and x.max() <= 1.0


def test_rgb_resize_channels_last_and_deterministic_augmentation(tmp_path):
    write_tree(tmp_path, ["cat", "dog"], mode="RGB", size=(20, 20))
    train, val, _ = load_image_folder(tmp_path, image_size=16, augment=None, channels_first=False, seed=3)
    assert train.augment and not val.augment
    a, _ = train.get_batch(np.arange(4), epoch=1)
    b, _ = train.get_batch(np.arange(4), epoch=1)
    c, _ = train.get_batch(np.arange(4), epoch=2)
    assert a.shape == (4, 16, 16, 3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_caps_take_a_seeded_subset_of_all_classes(tmp_path):
    write_tree(tmp_path, [str(i) for i in range(5)], per_class=10)
    train, val, _ = load_image_folder(tmp_path, image_size=None, augment=False, channels_first=True, seed=1,
                                      max_train=20, max_val=7)
    assert len(train) == 20 and len(val) == 7
    assert len(set(train.labels.tolist())) > 2  # not just the first classes
    again, _, _ = load_image_folder(tmp_path, image_size=None, augment=False, channels_first=True, seed=1,
                                    max_train=20)
    assert again.files == train.files


@pytest.mark.parametrize("break_tree,needle", [
    (lambda root: (root / "val" / "b").rename(root / "val" / "c"), "only in train: ['b']; only in val: ['c']"),
    (lambda root: [p.unlink() for p in (root / "train" / "a").iterdir()], "holds no images"),
    (lambda root: shutil.rmtree(root / "val"), "does not exist"),
])
def test_bad_trees_are_named(tmp_path, break_tree, needle):
    write_tree(tmp_path, ["a", "b"])
    break_tree(tmp_path)
    with pytest.raises(DataError) as err:
        load_image_folder(tmp_path, image_size=None, augment=None, channels_first=True, seed=0)
    assert needle in str(err.value)


def test_missing_root(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_image_folder(tmp_path / "nope", image_size=None, augment=None, channels_first=True, seed=0)
