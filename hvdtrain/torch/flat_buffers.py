"""Gradients kept in flat buffers: every trainable parameter's ``.grad`` is a view of one contiguous
buffer (per dtype, or per optimizer parameter group), so the backward pass accumulates into the
buffer and a collective reduces the buffer itself, in place.

One mechanism serves data parallelism (:class:`FlatAllreduce` over :func:`dtype_layouts`: one
allreduce of one buffer per dtype, reduced in place by Horovod with no fusion-buffer copies and
one negotiation per update) and the sharded optimizer (:mod:`hvdtrain.torch.sharded`: one buffer
per parameter group, padded to a multiple of the world size, each rank owning a slice).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import horovod.torch as hvd
import torch

from hvdtrain.core.config import ConfigError
from hvdtrain.core.exchange import Stateless


class FlatLayout:
    """Where each of ``params`` lies in one flat buffer padded to a multiple of ``size``, and which
    slice of it rank ``rank`` owns."""

    def __init__(self, params: list[torch.Tensor], size: int = 1, rank: int = 0) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise ConfigError(f"parallel.shard_optimizer: a parameter group holds tensors of several dtypes "
                              f"({', '.join(sorted(str(d) for d in dtypes))}); put each dtype in its own group")
        self.params = params
        self.numels = [p.numel() for p in params]
        self.total = sum(self.numels)
        self.shard = max(1, math.ceil(self.total / size))
        self.padded = self.shard * size
        self.start = rank * self.shard

    def flatten(self, tensors: list[torch.Tensor | None]) -> torch.Tensor:
        """The tensors (None: zeros) concatenated and zero-padded to the buffer's length."""
        like = self.params[0]
        pieces = [t.reshape(-1) if t is not None else torch.zeros(n, dtype=like.dtype, device=like.device)
                  for t, n in zip(tensors, self.numels)]
        if self.padded > self.total:
            pieces.append(torch.zeros(self.padded - self.total, dtype=like.dtype, device=like.device))
        return torch.cat(pieces)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` (a whole buffer) cut back into tensors shaped like the parameters."""
        return [piece.view_as(p) for piece, p in zip(torch.split(flat[:self.total], self.numels), self.params)]

    def mine(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a whole buffer."""
        return flat[self.start:self.start + self.shard]

    def empty(self) -> torch.Tensor:
        """A new zeroed buffer."""
        like = self.params[0]
        return torch.zeros(self.padded, dtype=like.dtype, device=like.device)


def dtype_layouts(params: list[torch.Tensor], optimizer: Any = None) -> list[FlatLayout]:
    """Data parallelism's layouts: one unpadded buffer per dtype (and device), the parameters in the
    order of ``optimizer``'s parameter groups (as Horovod's ``DistributedOptimizer`` fuses them and
    the sharded optimizer lays them out: each element then meets the same ranks' values in the same
    order, which float16 sums are sensitive to), then any others in ``params`` order."""
    ids = {id(p) for p in params}
    grouped = [p for group in (optimizer.param_groups if optimizer is not None else [])
               for p in group["params"] if id(p) in ids]
    seen = {id(p) for p in grouped}
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in grouped + [p for p in params if id(p) not in seen]:
        groups.setdefault((p.dtype, p.device), []).append(p)
    return [FlatLayout(group) for group in groups.values()]


class GradBuffers:
    """The parameters' gradients as views of one flat buffer per layout.

    :meth:`attach` (before a backward pass and before the exchange) makes every ``p.grad`` a view
    of its buffer again: a gradient something replaced (``zero_grad(set_to_none=True)``, Horovod's
    optimizer-state broadcast) is copied in, a missing one zeroed. :meth:`zero` clears the buffers
    after an update (only when an attach since the last zeroing may have let gradients in);
    :meth:`free` drops them (ZeRO-2) until the next :meth:`attach` allocates them zeroed."""

    def __init__(self, layouts: list[FlatLayout]) -> None:
        self.layouts = layouts
        self.flats: list[torch.Tensor | None] = [None] * len(layouts)
        self.views: list[list[torch.Tensor]] = [[] for _ in layouts]
        self.dirty = False  # whether the buffers may hold gradients (an attach since the last zero)
        self.attach()
        self.dirty = False

    @property
    def params(self) -> list[torch.Tensor]:
        """Every parameter, in layout order."""
        return [p for layout in self.layouts for p in layout.params]

    @torch.no_grad()
    def attach(self) -> None:
        """Every ``p.grad`` a view of its buffer (allocated, zeroed, where :meth:`free` dropped it)."""
        for i, layout in enumerate(self.layouts):
            fresh = self.flats[i] is None
            if fresh:
                self.flats[i] = layout.empty()
                self.views[i] = layout.split(self.flats[i])
            for p, view in zip(layout.params, self.views[i]):
                grad = p.grad
                if grad is view:
                    continue
                if grad is None:
                    if not fresh:
                        view.zero_()
                elif grad.data_ptr() != view.data_ptr():
                    view.copy_(grad)
                p.grad = view
        self.dirty = True

    @torch.no_grad()
    def zero(self) -> None:
        """Zero the buffers (if gradients may be in them) and point every ``p.grad`` at its view."""
        for i, layout in enumerate(self.layouts):
            if self.flats[i] is None:
                continue
            if self.dirty:
                self.flats[i].zero_()
            for p, view in zip(layout.params, self.views[i]):
                p.grad = view
        self.dirty = False

    def free(self) -> None:
        """Drop the buffers and the parameters' views of them."""
        for p in self.params:
            p.grad = None
        self.flats = [None] * len(self.layouts)
        self.views = [[] for _ in self.layouts]

    def nbytes(self) -> int:
        """Bytes the allocated buffers hold."""
        return sum(f.numel() * f.element_size() for f in self.flats if f is not None)


@torch.no_grad()
def allreduce_flats(flats: list[torch.Tensor], compression: Any, name: str) -> None:
    """Average ``flats`` across ranks in place, in one grouped allreduce (a single buffer: reduced by
    Horovod where it lies). Float16 on the wire as Horovod's ``Compression.fp16`` does it: cast,
    averaged in float16, cast back."""
    fp16 = compression is hvd.Compression.fp16
    wire = [f.to(torch.float16) if fp16 and f.is_floating_point() else f for f in flats]
    if len(wire) == 1:
        hvd.allreduce_(wire[0], op=hvd.Average, name=name)  # distributed
    else:
        hvd.grouped_allreduce_(wire, op=hvd.Average, name=name)  # distributed
    for flat, sent in zip(flats, wire):
        if sent is not flat:
            flat.copy_(sent)


class FlatAllreduce(Stateless):
    """Gradient exchange on flat buffers: every rank's gradients averaged in place in their buffers
    (one collective per update; optional float16 on the wire), left in each ``p.grad``.

    Data parallelism builds it on :func:`dtype_layouts` with ``owns_zeroing`` (the recipe's
    optimizer drops the gradients after the update; :meth:`after_update` zeroes the buffers and
    re-attaches the views); ZeRO-1 on the sharded optimizer's buffers, which it zeroes itself."""

    def __init__(self, buffers: GradBuffers, params: list[torch.Tensor], compression: Any,
                 owns_zeroing: bool = False) -> None:
        self.buffers, self.params, self.compression = buffers, params, compression
        self.owns_zeroing = owns_zeroing

    @torch.no_grad()
    def reduce(self, grads: list[Any]) -> list[Any]:
        """Average every rank's gradients in their flat buffers (a collective, in place); returns
        ``p.grad`` of ``params``. One process has nothing to average (nor does Horovod's
        ``DistributedOptimizer`` then)."""
        self.buffers.attach()
        if hvd.size() > 1:
            allreduce_flats(self.buffers.flats, self.compression, "hvdtrain.flat.grads")
        return [p.grad for p in self.params]

    def after_update(self) -> None:
        """Data parallelism: zero the buffers for the next window and point ``p.grad`` at them."""
        if self.owns_zeroing:
            self.buffers.zero()

    def stepping(self) -> Any:
        """Nothing around ``optimizer.step()``: the gradients are reduced already."""
        return contextlib.nullcontext()
