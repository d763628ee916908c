"""Decode one image into a uint8 HWC array of the policy's size, decoding only what the crop needs.

Pillow does the work: for a JPEG, ``Image.draft`` asks libjpeg(-turbo) for DCT-domain scaling
(1/2, 1/4 or 1/8 of the full size, the smallest that still gives the crop box at least the output
resolution), so a small crop of a large photo is decoded at a fraction of the cost; then
``resize`` with the crop ``box`` resamples only that region (antialiased bilinear), straight from
the decoded image (no intermediate crop copy).
Other formats are decoded whole. (Why Pillow: see "The image pipeline" in README.md and the
decoder comparison in BENCHMARKS.md.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from hvdtrain.data.transforms import SampleOp, TransformPolicy, pad_crop

DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def read_size(img: Image.Image) -> tuple[int, int]:
    """``(width, height)`` of an opened image (only its header has been read)."""
    return img.size


def decode(path: str | Path, policy: TransformPolicy, op_for, grayscale: bool) -> np.ndarray:
    """``op_for(width, height) -> SampleOp`` is called with the image's size; the result is the
    transformed image as uint8 ``(size, size, channels)``. Decoding errors propagate."""
    mode = "L" if grayscale else "RGB"
    size = policy.size
    with Image.open(path) as img:
        width, height = img.size
        op: SampleOp = op_for(width, height)
        box = op.box or (0, 0, width, height)
        left, top, w, h = box
        if img.format == "JPEG":
            reduce = min(w / size, h / size)  # how much smaller the output is than the box
            if reduce >= 2:
                img.draft(mode, (int(np.ceil(width / reduce)), int(np.ceil(height / reduce))))
        sx, sy = img.size[0] / width, img.size[1] / height
        if img.mode != mode:
            img = img.convert(mode)
        scaled = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
        if img.size == (size, size) and scaled == (0, 0, size, size):
            out = img
        else:
            out = img.resize((size, size), Image.BILINEAR, box=scaled)
        array = np.asarray(out, dtype=np.uint8)
    if grayscale:
        array = array[:, :, None]
    if op.shift is not None:
        array = pad_crop(array, op.shift, size)
    if op.flip:
        array = array[:, ::-1]
    return array
