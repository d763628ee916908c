"""The same image tree stored the ways users store image datasets, each by its real producer:
WebDataset tars (``webdataset.TarWriter``), Hugging Face Parquet (``datasets`` ``to_parquet``, the
Hub's ``data/<split>-0000k-of-0000n.parquet``) and a ``save_to_disk`` DatasetDict (Arrow). Samples
keep the ImageFolder index's order (sorted classes, sorted files), so sample i is the same photo
in every store.

    python image_stores.py TREE DEST FORMAT   # FORMAT: webdataset, parquet or arrow
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import datasets
import numpy as np
import webdataset


def samples(tree, split):
    """``(key, class, JPEG bytes)`` in the ImageFolder index's order (sorted classes, sorted files)."""
    out = []
    for cls in sorted(os.listdir(tree / split)):
        for name in sorted(os.listdir(tree / split / cls)):
            out.append((f"{cls}_{name.split('.')[0]}", cls, (tree / split / cls / name).read_bytes()))
    return out


def write_tars(tree, root, label="cls", shards=2):
    classes = sorted(os.listdir(tree / "train"))
    for split in ("train", "val"):
        rows = samples(tree, split)
        (root / split).mkdir(parents=True)
        for k, part in enumerate(np.array_split(np.arange(len(rows)), shards)):
            with webdataset.TarWriter(str(root / split / f"{split}-{k:06d}.tar")) as sink:
                for i in part:
                    key, cls, data = rows[i]
                    value = {"cls": classes.index(cls)} if label == "cls" else {"json": {"label": cls}}
                    sink.write({"__key__": key, "jpg": data, **value})
    (root / "manifest.json").write_text(json.dumps({"format": "webdataset", "classes": classes}))
    return root


def hf_dataset(tree, split):
    classes = sorted(os.listdir(tree / "train"))
    rows = samples(tree, split)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    return datasets.Dataset.from_dict(
        {"image": [{"bytes": data, "path": f"{key}.jpg"} for key, _, data in rows],
         "label": [classes.index(cls) for _, cls, _ in rows]}, features=features)


def write_parquet(tree, root, shards=2):
    (root / "data").mkdir(parents=True)
    for split, name in (("train", "train"), ("val", "validation")):
        ds = hf_dataset(tree, split)
        for k in range(shards):
            ds.shard(shards, k, contiguous=True).to_parquet(str(root / "data" / f"{name}-{k:05d}-of-{shards:05d}.parquet"),
                                                            batch_size=5)  # row groups of 5: random reads cross them
    return root


def write_arrow(tree, root):
    splits = datasets.DatasetDict({"train": hf_dataset(tree, "train"), "validation": hf_dataset(tree, "val")})
    splits.save_to_disk(str(root), num_shards={"train": 2, "validation": 1})
    return root


WRITERS = {"webdataset": write_tars, "parquet": write_parquet, "arrow": write_arrow}

if __name__ == "__main__":
    tree, dest, fmt = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    print(WRITERS[fmt](tree, dest))
