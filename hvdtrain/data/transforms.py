"""Transform policies and their per-sample parameters, drawn from ``(seed, epoch, sample index)`` alone.

Every transform is "crop a box of the original image, resize it to ``size`` x ``size``, maybe
flip", so a decoder can decode just what the box needs:

* ``imagenet`` training: RandomResizedCrop (area 8-100 %, aspect 3/4-4/3, torchvision's
  algorithm: ten tries, then a centre crop) + horizontal flip; validation: resize the shorter side
  to ``size / 0.875`` and take the centre ``size`` x ``size`` (in original coordinates: the
  centre square of 0.875 x the shorter side).
* ``pad-crop`` (small images, CIFAR/MNIST-like): squash to ``size``, reflection-pad by
  ``size // 8``, random crop back to ``size`` + flip; validation: squash only.
* ``resize``: squash to ``size``, no augmentation (training and validation).

Because nothing depends on which process or in which order a sample is prepared, batches are
bitwise identical with 1 or N worker processes, in both frameworks and after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

POLICIES = ("auto", "imagenet", "pad-crop", "resize")
SMALL_IMAGE = 64  # images up to this many pixels a side keep the pad-and-crop recipe


@dataclass(frozen=True)
class TransformPolicy:
    """What happens to one image: ``kind`` (imagenet, pad-crop or resize), output ``size``,
    whether training samples are augmented, and the RandomResizedCrop ranges."""

    kind: str
    size: int
    augment: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    val_crop: float = 0.875

    def describe(self) -> str:
        """One line for the start-up banner."""
        if self.kind == "imagenet":
            train = (f"RandomResizedCrop {self.size} (scale {self.scale[0]:g}-{self.scale[1]:g}, ratio "
                     f"{self.ratio[0]:.2f}-{self.ratio[1]:.2f}) + flip" if self.augment else
                     f"resize {round(self.size / self.val_crop)} + centre crop {self.size}")
            return f"train: {train}; val: resize shorter side to {round(self.size / self.val_crop)} + centre crop {self.size}"
        if self.kind == "pad-crop":
            train = f"resize {self.size} + pad {max(1, self.size // 8)} + random crop + flip" if self.augment \
                else f"resize {self.size}"
            return f"train: {train}; val: resize {self.size}"
        return f"train and val: resize {self.size} (no augmentation)"


def choose_policy(kind: str, size: int | None, native: tuple[int, int], augment: bool | None,
                  grayscale: bool, default_large_size: int = 224) -> TransformPolicy:
    """The policy for ``kind`` (``auto``: ``pad-crop`` for images up to 64 pixels, else
    ``imagenet``); ``size`` None keeps small images' native size and gives large ones
    ``default_large_size``; ``augment`` None augments colour images and not grayscale ones
    (digits must not be flipped)."""
    small = max(native) <= SMALL_IMAGE
    if kind == "auto":
        kind = "pad-crop" if small else "imagenet"
    if size is None:
        size = min(native) if small else default_large_size
    augment = (not grayscale) if augment is None else augment
    if kind == "resize":
        augment = False
    return TransformPolicy(kind, int(size), augment)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random stream of sample ``index`` in ``epoch``: nothing else goes into it."""
    return np.random.default_rng([seed, epoch, index])


def random_resized_box(rng: np.random.Generator, width: int, height: int, scale: tuple[float, float],
                       ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box ``(left, top, w, h)`` for an image of ``width`` x ``height``."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    draws = rng.random((10, 4))
    for u_area, u_ratio, u_top, u_left in draws:
        target = area * (scale[0] + (scale[1] - scale[0]) * u_area)
        aspect = math.exp(log_lo + (log_hi - log_lo) * u_ratio)
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(u_left * (width - w + 1)), int(u_top * (height - h + 1)), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def centre_box(width: int, height: int, fraction: float) -> tuple[int, int, int, int]:
    """The centre square of ``fraction`` x the shorter side, as ``(left, top, w, h)``."""
    side = max(1, int(round(min(width, height) * fraction)))
    return (width - side) // 2, (height - side) // 2, side, side


@dataclass(frozen=True)
class SampleOp:
    """What to do with one image: crop ``box`` (left, top, w, h; None: the whole image), resize to
    the policy size, then for pad-crop shift by ``shift`` (dy, dx) inside the reflection-padded
    image, then flip if ``flip``."""

    box: tuple[int, int, int, int] | None
    flip: bool
    shift: tuple[int, int] | None = None


def sample_op(policy: TransformPolicy, width: int, height: int, seed: int, epoch: int, index: int,
              train: bool) -> SampleOp:
    """The operation for sample ``index`` of an image of ``width`` x ``height``; ``train`` False
    (validation, ``epoch`` < 0) is deterministic."""
    augment = train and policy.augment and epoch >= 0
    if policy.kind == "imagenet":
        if not augment:
            return SampleOp(centre_box(width, height, policy.val_crop), False)
        rng = sample_rng(seed, epoch, index)
        box = random_resized_box(rng, width, height, policy.scale, policy.ratio)
        return SampleOp(box, bool(rng.random() < 0.5))
    if policy.kind == "pad-crop" and augment:
        rng = sample_rng(seed, epoch, index)
        pad = max(1, policy.size // 8)
        top, left = rng.integers(0, 2 * pad + 1, size=2)
        return SampleOp(None, bool(rng.random() < 0.5), (int(top), int(left)))
    return SampleOp(None, False)


def pad_crop(image: np.ndarray, shift: tuple[int, int], size: int) -> np.ndarray:
    """Reflection-pad an HWC ``image`` by ``size // 8`` and take the ``size`` square at ``shift``."""
    pad = max(1, size // 8)
    padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)), mode="reflect")
    return padded[shift[0]:shift[0] + size, shift[1]:shift[1] + size]
