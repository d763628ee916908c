"""Bad input gets a clear error naming it, a non-zero exit, and nothing written over.

(Unknown recipe, framework and config keys, wrong types and out-of-range values are covered by
tests/integration/test_cli.py and tests/unit/test_config.py.)"""

import numpy as np
import pytest
from PIL import Image

from jobs import horovodrun, hvdtrain_cli, run


def image_tree(root, classes=("a", "b"), per_class=12):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), mode="L").save(
                    root / split / cls / f"{i}.png")
    return root


def recipe(data, out, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--data", data, "--output", out, "--epochs", "1",
            "--batch-size", "4", "--set", "train.log_every=0", *extra]


def test_unreadable_image_fails_naming_the_file(tmp_path):
    data = image_tree(tmp_path / "data")
    (data / "train" / "a" / "broken.png").write_bytes(b"this is not a png")
    proc = run(recipe(data, tmp_path / "out"), check=False)
    assert proc.returncode == 1
    assert "broken.png" in proc.stderr and "image.bad_files=skip" in proc.stderr


@pytest.mark.distributed
def test_unreadable_image_is_replaced_and_counted_on_two_ranks(tmp_path):
    data = image_tree(tmp_path / "data")
    (data / "train" / "a" / "broken.png").write_bytes(b"this is not a png")
    proc = horovodrun(recipe(data, tmp_path / "out", "--set", "data.bad_files=skip"))  # the old spelling still works
    # found when decoded, on whichever rank meets it; a stand-in keeps every rank's step count
    assert "1 unreadable train image(s) replaced by stand-ins" in proc.stderr and "broken.png" in proc.stderr
    assert "25 train" in proc.stdout


@pytest.mark.parametrize("damage,needle", [
    (lambda d: (d / "val" / "b").rename(d / "val" / "c"), "class folders differ"),
    (lambda d: [p.unlink() for p in (d / "train" / "b").iterdir()], "holds no images"),
    (lambda d: [p.unlink() for p in (d / "val").rglob("*.png")], "holds no images"),
])
def test_inconsistent_trees_are_named(tmp_path, damage, needle):
    data = image_tree(tmp_path / "data")
    damage(data)
    proc = run(recipe(data, tmp_path / "out"), check=False)
    assert proc.returncode == 1 and needle in proc.stderr, proc.stderr


@pytest.mark.parametrize("args,needle", [
    (["--batch-size", "0"], "train.batch_size: 0 is out of range"),
    (["--set", "train.nonfinite=ignore"], "choose one of: error, skip"),
    (["--set", "checkpoint.every_steps=-1"], "checkpoint.every_steps"),
    (["--set", "data.bad_files=maybe"], "choose one of: error, skip"),
])
def test_bad_values_are_named(tmp_path, args, needle):
    proc = run(recipe(image_tree(tmp_path / "data"), tmp_path / "out") + args, check=False)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.distributed
def test_fewer_samples_than_workers(tmp_path):
    data = image_tree(tmp_path / "data")
    proc = horovodrun(recipe(data, tmp_path / "out", "--set", "data.max_train_samples=1"), check=False)
    assert proc.returncode != 0 and "1 training samples cannot be shared by 2 workers" in proc.stdout + proc.stderr
