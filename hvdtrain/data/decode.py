"""Decode one image into a uint8 HWC array of the policy's size, decoding only what the crop needs.

JPEGs (baseline and progressive, grayscale or YCbCr/RGB) take the fast path: libjpeg-turbo through
``simplejpeg`` decodes with DCT-domain scaling (1/2, 1/4 or 1/8 of the full size: the smallest that
still gives the crop box at least the output resolution, so the large reductions are low-passed
in the DCT domain, and a small crop of a large photo costs a fraction of a full decode), then
OpenCV's bit-exact bilinear ``resize`` (``INTER_LINEAR_EXACT``, fixed-point, the same bytes on
every CPU) resamples the crop box to the output size. That last step is not antialiased: after
DCT scaling it shrinks by less than 2x. Measured on real photos (benchmarks/decoders.py), this is
about 2x Pillow's images per CPU-second and above ``tf.data``'s ``decode_and_crop_jpeg``; why
this decoder: "The image pipeline" in docs/guides/data.md.

Other formats, and CMYK/YCCK JPEGs, go through Pillow as before: for a JPEG, ``Image.draft`` gives
the same DCT scaling; ``resize`` with the crop ``box`` resamples only that region (antialiased bilinear).

Bounds and depths: what is decoded (after DCT scaling) may hold at most ``PIL.Image.MAX_IMAGE_PIXELS``
pixels (89.5 M by default); Pillow itself refuses files of more than twice that at open and only
warns in between, so a 90-180 Mpx PNG would otherwise be decoded whole in every worker. A larger
one is an unreadable file (``image.bad_files`` decides). 16-bit and 32-bit integer images (16-bit
PNG and TIFF) are scaled to 8 bits (``round(v * 255 / 65535)``) instead of being clipped at 255.
32-bit float images (Pillow's mode ``F``: float TIFFs) hold values in [0, 1] and are scaled to
0-255 (``round(v * 255)``); Pillow's own conversion clipped them, so [0, 1] decoded black. A float
image with values outside [0, 1] (or NaN) is refused as unreadable, naming its range: scaling each
image by its own range would change what a pixel value means from one file to the next.

Only the formats the data layer documents are opened (:data:`~hvdtrain.data.index.PILLOW_FORMATS`:
JPEG, PNG, BMP, GIF, WebP, TIFF, PPM), whatever the file's name says; any other format Pillow
knows (EPS through Ghostscript, PSD, ...) is an unreadable file.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np
import simplejpeg
from PIL import Image

from hvdtrain.data.index import open_image
from hvdtrain.data.transforms import SampleOp, TransformPolicy, pad_crop

DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
WIDE_INTEGER_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")
FLOAT_MODES = ("F",)  # 32-bit float, one channel: values in [0, 1]
FLOAT_SLACK = 1e-3  # a float pixel this far outside [0, 1] is rounding (clipped), beyond it the image is refused
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


def float_to_8bit(img: Image.Image) -> Image.Image:
    """A float image (mode ``F``) with values in [0, 1] as 8-bit ``L`` (``round(v * 255)``); one
    with values outside [0, 1] (beyond :data:`FLOAT_SLACK`) or not finite raises ValueError
    naming its range."""
    values = np.asarray(img, dtype=np.float32)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if not (np.isfinite(low) and np.isfinite(high)) or low < -FLOAT_SLACK or high > 1 + FLOAT_SLACK:
        raise ValueError(f"it is a 32-bit float image with values in [{low:g}, {high:g}]; a float image must "
                         f"hold values in [0, 1] (decoded as 0-255): rescale it, or save it as 8 or 16 bits")
    return Image.fromarray(np.rint(np.clip(values, 0, 1) * 255).astype(np.uint8), mode="L")


def read_size(img: Image.Image) -> tuple[int, int]:
    """``(width, height)`` of an opened image (only its header has been read)."""
    return img.size


JPEG_START = b"\xff\xd8\xff"
FAST_COLOURSPACES = ("Gray", "YCbCr", "RGB")  # what libjpeg-turbo turns into RGB or gray itself
DCT_SCALES = (8, 4, 2)  # the reductions libjpeg-turbo does with SIMD


def decode(source: str | Path | bytes | BinaryIO, policy: TransformPolicy, op_for, grayscale: bool) -> np.ndarray:
    """Decode ``source`` (a path, the encoded bytes, or a binary file object): ``op_for(width,
    height) -> SampleOp`` is called with the image's size; the result is the transformed image as
    uint8 ``(size, size, channels)``. Decoding errors propagate."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as f:
            source = f.read()
    elif not isinstance(source, (bytes, bytearray, memoryview)):
        source = source.read()
    data = bytes(source)
    if data[:3] == JPEG_START:
        height, width, colourspace, _ = simplejpeg.decode_jpeg_header(data)
        if colourspace in FAST_COLOURSPACES:
            op: SampleOp = op_for(width, height)
            return finish(decode_jpeg(data, width, height, op.box, policy.size, grayscale), op, policy.size)
    return decode_pillow(data, policy, op_for, grayscale)


def decode_jpeg(data: bytes, width: int, height: int, box: tuple[int, int, int, int] | None, size: int,
                grayscale: bool) -> np.ndarray:
    """The JPEG ``data`` (``width`` x ``height``) cropped to ``box`` (None: all) and resized to
    ``size`` x ``size``: libjpeg-turbo's DCT scaling, then OpenCV's bit-exact bilinear resize."""
    left, top, w, h = box or (0, 0, width, height)
    reduce = min(w, h) / size
    scale = next((s for s in DCT_SCALES if reduce >= s), 1)
    check_decoded_size(-(-width // scale), -(-height // scale))
    image = simplejpeg.decode_jpeg(data, colorspace="GRAY" if grayscale else "RGB", min_factor=2,
                                   min_width=-(-width // scale), min_height=-(-height // scale))
    sx, sy = image.shape[1] / width, image.shape[0] / height
    x0, y0 = min(int(round(left * sx)), image.shape[1] - 1), min(int(round(top * sy)), image.shape[0] - 1)
    x1, y1 = max(x0 + 1, int(round((left + w) * sx))), max(y0 + 1, int(round((top + h) * sy)))
    crop = image[y0:y1, x0:x1]
    if crop.shape[:2] != (size, size):
        crop = cv2.resize(crop, (size, size), interpolation=cv2.INTER_LINEAR_EXACT)
    return crop.reshape(size, size, -1)


def finish(array: np.ndarray, op: SampleOp, size: int) -> np.ndarray:
    """The pad-crop shift and the flip of ``op`` applied to the resized ``array``."""
    if op.shift is not None:
        array = pad_crop(array, op.shift, size)
    if op.flip:  # OpenCV's flip: a copy of a numpy view reversed along the width costs 25x more
        array = cv2.flip(np.ascontiguousarray(array), 1).reshape(array.shape)
    return array


def decode_pillow(data: bytes, policy: TransformPolicy, op_for, grayscale: bool) -> np.ndarray:
    """:func:`decode` through Pillow: formats other than JPEG, and CMYK/YCCK JPEGs."""
    mode = "L" if grayscale else "RGB"
    size = policy.size
    with open_image(data) as img:
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
        elif img.mode in FLOAT_MODES:
            img = float_to_8bit(img)
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
    return finish(array, op, size)
