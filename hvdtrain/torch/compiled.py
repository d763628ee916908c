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


def step_module(model: torch.nn.Module, mode: str) -> Any:
    """The callable for the training and evaluation forward: ``model`` for ``mode='none'``, else
    ``torch.compile(model)`` in ``mode`` (one of :data:`~hvdtrain.core.compiled.MODES`)."""
    if mode == "none":
        return model
    if mode not in MODES:
        raise ValueError(f"train.compile: {mode!r} is not a torch.compile mode; choose one of none, {', '.join(MODES)}")
    return torch.compile(model, mode=None if mode == "default" else mode)


def describe(mode: str) -> str | None:
    """What the compile-time line names (``torch.compile mode=default, ...``); None when eager."""
    return None if mode == "none" else f"torch.compile mode={mode}, forward and backward"
