"""``train.compile`` for PyTorch: the model's forward and backward through ``torch.compile``.

:func:`step_module` returns what the adapter calls for the forward pass: the model itself when
eager, else ``torch.compile(model, mode=...)`` (Inductor). The compiled module wraps the model
and shares its parameters and buffers, so:

* the compiled backward ends in the parameters' own gradient accumulators, where
  ``hvd.DistributedOptimizer`` registered its hooks: each allreduce still starts from its hook
  (once the compiled backward has produced the gradients of the graph, not one by one during it)
  and every exchange (fp16, PowerSGD/top-k, local SGD, the sharded optimizer) reads ``p.grad``
  as it does eagerly; the optimizer update stays eager;
* the adapter keeps saving and loading ``self.model`` (the original), whose ``state_dict`` keys
  carry no ``_orig_mod.`` prefix: compiled and eager runs resume each other's checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch

from hvdtrain.core.compiled import MODES


#: Inductor options per device type, chosen by measurement (``benchmarks/compile_speed.py``).
#: CPU: ``fallback_random`` makes dropout call ATen's random kernels, as eagerly, instead of
#: Inductor's C++ code, which builds a Philox generator for every element: on the BERT recipe
#: (batch 8, 128 tokens, one thread) that code cost 0.24 s of a 1.18 s step (compiled/eager 0.83;
#: 1.00 with the option), and the compiled step now draws the same dropout masks as the eager one.
#: On a GPU Inductor's fused Triton random numbers are the faster choice: no options there.
DEVICE_OPTIONS: dict[str, dict[str, Any]] = {"cpu": {"fallback_random": True}}


def step_module(model: torch.nn.Module, mode: str, device: str = "cpu") -> Any:
    """The callable for the training and evaluation forward: ``model`` for ``mode='none'``, else
    ``torch.compile(model)`` in ``mode`` (one of :data:`~hvdtrain.core.compiled.MODES`), with the
    :data:`DEVICE_OPTIONS` of ``device`` (a device type: ``cpu``, ``cuda``)."""
    if mode == "none":
        return model
    if mode not in MODES:
        raise ValueError(f"train.compile: {mode!r} is not a torch.compile mode; choose one of none, {', '.join(MODES)}")
    if device not in DEVICE_OPTIONS:
        return torch.compile(model, mode=mode)
    # torch.compile takes a mode or options: the mode's own options (what mode= would set), then the device's
    from torch._inductor import list_mode_options
    return torch.compile(model, options={**list_mode_options(mode), **DEVICE_OPTIONS[device]})


def describe(mode: str) -> str | None:
    """What the compile-time line names (``torch.compile mode=default, ...``); None when eager."""
    return None if mode == "none" else f"torch.compile mode={mode}, forward and backward"
