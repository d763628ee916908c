"""An ImageNet-shaped tree for the start-up benchmark: 1,281,167 files in 1,000 class folders.

File names follow ImageNet's (``n01440764/n01440764_10026.JPEG``); every file of a class is a hard
link to one tiny real JPEG (8x8 pixels; ext4 allows 65,000 links per file), so the tree is readable end to end yet costs inodes' worth of
directory entries instead of 5 GB of blocks. Write it under /tmp::

    .venv/bin/python benchmarks/startup_tree.py /tmp/imagenet-shaped
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image

TOTAL, CLASSES = 1_281_167, 1000


def make(root: Path, total: int = TOTAL, classes: int = CLASSES) -> Path:
    """Write ``root/train`` (``total`` files) and a small ``root/val`` (2 per class)."""
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 128, np.uint8)).save(buf, format="JPEG", quality=90)
    jpeg = buf.getvalue()
    per = [total // classes + (1 if c < total % classes else 0) for c in range(classes)]
    for split, counts in (("train", per), ("val", [2] * classes)):
        for c, count in enumerate(counts):
            name = f"n{1440764 + c * 997:08d}"
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            first = folder / f"{name}_1.JPEG"
            first.write_bytes(jpeg)
            for i in range(1, count):
                os.link(first, folder / f"{name}_{i + 1}.JPEG")
    (root / ".complete").write_text(f"{total}\n")
    return root


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/imagenet-shaped")
    if not (target / ".complete").is_file():
        make(target)
    print(target)
