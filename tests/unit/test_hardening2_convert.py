"""Issue 41, item 3: a half-finished or damaged ``hvdtrain convert`` output never trains.

Before: a conversion killed mid-way left ``.hvdtrain-convert/`` and no ``manifest.json``, and
training on it ran on the shards written so far (50 of 200 validation samples) with exit 0; a
finished conversion with two shards deleted trained on what was left. The conversions here are
real (``hvdtrain.data.convert.convert``, in this process); the "kill" is an exception raised from
its progress callback after the second shard, which leaves exactly what a kill leaves.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hvdtrain.data.convert import convert
from hvdtrain.data.errors import DataError
from hvdtrain.data.shards import load_shard_index
from hvdtrain.data.layouts import find_shards


def image_tree(root: Path, per_class: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), mode="L").save(
                    root / split / cls / f"{i}.png")
    return root


class Killed(Exception):
    pass


def converted(tmp_path: Path, kill_after: int | None = None) -> Path:
    src, dest = image_tree(tmp_path / "src"), tmp_path / "shards"
    seen = []

    def progress(entry):
        seen.append(entry)
        if kill_after is not None and len(seen) == kill_after:
            raise Killed

    try:
        convert(src, dest, "webdataset", samples_per_shard=4, cache=tmp_path / "cache", progress=progress)
    except Killed:
        pass
    return dest


def index(dest: Path, split: str, tmp_path: Path):
    return load_shard_index(find_shards(dest, "webdataset", None, (split,), f"image.{split}_shards"), "webdataset",
                            cache=tmp_path / "index")


def test_a_finished_conversion_trains_on_every_sample(tmp_path):
    dest = converted(tmp_path)
    assert len(index(dest, "train", tmp_path).labels) == 16 and len(index(dest, "val", tmp_path).labels) == 16


def test_an_unfinished_conversion_is_refused(tmp_path):
    dest = converted(tmp_path, kill_after=2)
    assert (dest / ".hvdtrain-convert").is_dir() and not (dest / "manifest.json").exists()
    with pytest.raises(DataError, match=r"holds an unfinished hvdtrain convert .*run the same hvdtrain convert"):
        index(dest, "train", tmp_path)


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_shards_that_no_longer_match_the_manifest_are_refused(tmp_path, damage):
    dest = converted(tmp_path)
    manifest = json.loads((dest / "manifest.json").read_text())
    victim = dest / manifest["splits"]["val"]["shards"][-1]["name"]
    index(dest, "val", tmp_path)  # cached while whole: the check does not rely on the index cache
    if damage == "deleted":
        victim.unlink()
        needle = f"shard {victim} of split val is missing"
    else:
        victim.write_bytes(victim.read_bytes()[:512])
        needle = f"shard {victim} has 512 bytes"
    with pytest.raises(DataError) as caught:
        index(dest, "val", tmp_path)
    assert needle in str(caught.value) and str(dest / "manifest.json") in str(caught.value)
    assert len(index(dest, "train", tmp_path).labels) == 16  # the untouched split still reads


def test_a_shard_holding_other_samples_than_the_manifest_records_is_refused(tmp_path):
    dest = converted(tmp_path)
    manifest = json.loads((dest / "manifest.json").read_text())
    entry = manifest["splits"]["val"]["shards"][0]
    entry["samples"] += 1  # the manifest and the shard disagree (one was replaced or edited)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=rf"shard {dest / entry['name']} holds 4 samples, .*manifest.json records 5"):
        index(dest, "val", tmp_path)


def test_a_chosen_subset_of_a_whole_conversion_still_reads(tmp_path):
    dest = converted(tmp_path)
    first = sorted((dest / "train").glob("*.tar"))[:1] or sorted(dest.glob("train*.tar"))[:1]
    assert len(load_shard_index(first, "webdataset", cache=tmp_path / "index").labels) == 4
