"""Decode one image into a uint8 HWC array of the policy's size, decoding only what the crop needs.

Pillow does the work: for a JPEG, ``Image.draft`` asks libjpeg(-turbo) for DCT-domain scaling
(1/2, 1/4 or 1/8 of the full size, the smallest that still gives the crop box at least the output
resolution), so a small crop of a large photo is decoded at a fraction of the cost; then
``resize`` with the crop ``box`` resamples only that region (antialiased bilinear), straight from
the decoded image (no intermediate crop copy).
Other formats are decoded whole. (Why Pillow: see "The image pipeline" in README.md and the
decoder comparison in BENCHMARKS.md.)

Bounds and depths: what is decoded (after DCT scaling) may hold at most ``PIL.Image.MAX_IMAGE_PIXELS``
pixels (89.5 M by default); Pillow itself refuses files of more than twice that at open and only
warns in between, so a 90-180 Mpx PNG would otherwise be decoded whole in every worker. A larger
one is an unreadable file (``image.bad_files`` decides). 16-bit and 32-bit integer images (16-bit
PNG and TIFF) are scaled to 8 bits (``round(v * 255 / 65535)``) instead of being clipped at 255.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image

from hvdtrain.data.transforms import SampleOp, TransformPolicy, pad_crop

DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
WIDE_INTEGER_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")
# The bound is enforced below on what is decoded; Pillow's warning at open would only be noise.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def check_decoded_size(width: int, height: int) -> None:
    """Refuse to decode more than ``PIL.Image.MAX_IMAGE_PIXELS`` pixels (None: no bound)."""
    bound = Image.MAX_IMAGE_PIXELS
    if bound is not None and width * height > bound:
        raise ValueError(f"it is {width}x{height} ({width * height / 1e6:.1f} Mpx), more than the "
                         f"{bound / 1e6:.1f} Mpx an image may decode to (PIL.Image.MAX_IMAGE_PIXELS); downscale it")


def to_8bit(img: Image.Image) -> Image.Image:
    """A 16-bit (or 32-bit integer) single-channel image as 8-bit ``L``, scaled from 0-65535."""
    wide = np.asarray(img).astype(np.int64)
    return Image.fromarray(((np.clip(wide, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8), mode="L")


def read_size(img: Image.Image) -> tuple[int, int]:
    """``(width, height)`` of an opened image (only its header has been read)."""
    return img.size


def decode(source: str | Path | bytes | BinaryIO, policy: TransformPolicy, op_for, grayscale: bool) -> np.ndarray:
    """Decode ``source`` (a path, the encoded bytes, or a binary file object): ``op_for(width,
    height) -> SampleOp`` is called with the image's size; the result is the transformed image as
    uint8 ``(size, size, channels)``. Decoding errors propagate."""
    mode = "L" if grayscale else "RGB"
    size = policy.size
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(source)
    with Image.open(source) as img:
        width, height = img.size
        op: SampleOp = op_for(width, height)
        box = op.box or (0, 0, width, height)
        left, top, w, h = box
        if img.format == "JPEG":
            reduce = min(w / size, h / size)  # how much smaller the output is than the box
            if reduce >= 2:
                img.draft(mode, (int(np.ceil(width / reduce)), int(np.ceil(height / reduce))))
        sx, sy = img.size[0] / width, img.size[1] / height
        check_decoded_size(*img.size)
        if img.mode in WIDE_INTEGER_MODES:
            img = to_8bit(img)
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
