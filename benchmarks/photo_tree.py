"""A tree of real-photo JPEGs for the image-pipeline benchmarks and tests.

The photos are the colour photographs shipped in scikit-image's data module (astronaut, cat,
coffee, rocket, motorcycles, Hubble deep field, retina, immunohistochemistry), located through
the installed package's files (scikit-image is not imported). Each class is one photo; each
image is a random crop of it (40-100 % of the area, aspect 3/4-4/3), resized to about 500x375 (or
375x500), maybe mirrored, saved as JPEG quality 90: ImageNet-like sizes and real image content.

    .venv/bin/python benchmarks/photo_tree.py /tmp/photos --train 200 --val 50
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg",
          "retina.jpg", "ihc.png")


def photo_dir() -> Path:
    """``skimage/data`` of the installed scikit-image (pip install scikit-image==0.26.0)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the real-photo tree needs scikit-image's data files: pip install scikit-image==0.26.0")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def available() -> bool:
    """True if scikit-image's photos are installed."""
    try:
        return all((photo_dir() / name).is_file() for name in PHOTOS)
    except FileNotFoundError:
        return False


def make_tree(root: str | Path, classes: int = 4, train: int = 40, val: int = 10, size: tuple[int, int] = (500, 375),
              quality: int = 90, seed: int = 0, photos: tuple[str, ...] = PHOTOS) -> Path:
    """Write ``root/{train,val}/<photo>/<n>.JPEG``: ``train``/``val`` images per class of ``size`` (W, H),
    the classes being the first ``classes`` of ``photos`` (file names in scikit-image's data folder)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for name in photos[:classes]:
        with Image.open(photo_dir() / name) as img:
            source = img.convert("RGB")
        width, height = source.size
        for split, count in (("train", train), ("val", val)):
            folder = root / split / Path(name).stem
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                area = width * height * rng.uniform(0.4, 1.0)
                aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
                w = int(min(width, round(np.sqrt(area * aspect))))
                h = int(min(height, round(np.sqrt(area / aspect))))
                left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
                out = size if rng.random() < 0.75 else (size[1], size[0])
                crop = source.resize(out, Image.BICUBIC, box=(left, top, left + w, top + h))
                if rng.random() < 0.5:
                    crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
                crop.save(folder / f"{i:05d}.JPEG", quality=quality)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--classes", type=int, default=len(PHOTOS))
    parser.add_argument("--train", type=int, default=200)
    parser.add_argument("--val", type=int, default=50)
    args = parser.parse_args()
    print(make_tree(args.root, args.classes, args.train, args.val))


if __name__ == "__main__":
    main()
