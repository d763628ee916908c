"""uint8 NHWC image batches to normalised float NCHW tensors, on the model's device.

:func:`normalize_inputs` attaches this as a forward pre-hook, so the adapter moves the compact
uint8 batch (a quarter of float32's bytes) and the conversion runs on the GPU where there is
one, in channels-last memory layout there (what Tensor Cores want); on CPU the result is a
contiguous NCHW tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from hvdtrain.data.normalize import scaled_constants


def to_float_nchw(x: torch.Tensor) -> torch.Tensor:
    """``(x - 255 mean) / (255 std)`` of a uint8 NHWC batch, as float32 NCHW; other tensors pass through."""
    if x.dtype != torch.uint8:
        return x
    mean, std = (torch.from_numpy(c).to(x.device).view(1, -1, 1, 1) for c in scaled_constants(x.shape[-1]))
    layout = torch.channels_last if x.is_cuda else torch.contiguous_format
    return ((x.permute(0, 3, 1, 2).float() - mean) / std).contiguous(memory_format=layout)


def normalize_inputs(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model`` accept uint8 NHWC batches (state dict unchanged: a forward pre-hook)."""

    def hook(module: Any, args: tuple) -> tuple:
        return (to_float_nchw(args[0]), *args[1:])

    model.register_forward_pre_hook(hook)
    return model
