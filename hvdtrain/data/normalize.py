"""Normalisation constants shared by the framework-side image functions.

Both frameworks compute ``(x - 255 * mean) / (255 * std)`` in float32 with these exact float32
constants, so a uint8 batch becomes bitwise the same float batch in torch and in TensorFlow.
"""

from __future__ import annotations

import numpy as np

RGB_MEAN, RGB_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet statistics
GRAY_MEAN, GRAY_STD = (0.5,), (0.5,)


def scaled_constants(channels: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``255 * mean`` and ``255 * std`` for 1 (grayscale) or 3 (RGB) channels."""
    mean, std = (GRAY_MEAN, GRAY_STD) if channels == 1 else (RGB_MEAN, RGB_STD)
    return (np.asarray(mean, np.float32) * np.float32(255)), (np.asarray(std, np.float32) * np.float32(255))


def normalize_numpy(batch: np.ndarray, channels_first: bool = False) -> np.ndarray:
    """The same normalisation in NumPy (for recipes that want float batches on the host)."""
    mean, std = scaled_constants(batch.shape[-1])
    x = (batch.astype(np.float32) - mean) / std
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if channels_first else x
