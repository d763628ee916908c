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
from hvdtrain.torch.host_memory import huge_page_zeros


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
        """A new zeroed buffer (a CPU one on huge pages: :mod:`hvdtrain.torch.host_memory`)."""
        like = self.params[0]
        return huge_page_zeros(self.padded, like.dtype, like.device)


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

    The layouts of one dtype and device share one allocation, :attr:`wholes`, each layout's buffer
    a view of it in layout order (the sharded optimizer's groups with and without weight decay
    are one buffer, as in Horovod's fusion buffer): the exchange reduces each whole in place with
    one collective.

    :meth:`attach` (before a backward pass and before the exchange) makes every ``p.grad`` a view
    of its buffer again: a gradient something replaced (``zero_grad(set_to_none=True)``, Horovod's
    optimizer-state broadcast) is copied in, a missing one zeroed. :meth:`zero` clears the buffers
    after an update (only when an attach since the last zeroing may have let gradients in);
    :meth:`free` drops them (ZeRO-2) until the next :meth:`attach` allocates them zeroed."""

    def __init__(self, layouts: list[FlatLayout]) -> None:
        self.layouts = layouts
        self.wholes: list[torch.Tensor] = []  # one per dtype and device; the flats are views of them
        self.flats: list[torch.Tensor | None] = [None] * len(layouts)
        self.views: list[list[torch.Tensor]] = [[] for _ in layouts]
        self.dirty = False  # whether the buffers may hold gradients (an attach since the last zero)
        self.attach()
        self.dirty = False

    @property
    def params(self) -> list[torch.Tensor]:
        """Every parameter, in layout order."""
        return [p for layout in self.layouts for p in layout.params]

    def _allocate(self) -> None:
        """The zeroed :attr:`wholes` and every layout's buffer and parameter views in them."""
        kinds: dict[tuple, list[int]] = {}
        for i, layout in enumerate(self.layouts):
            kinds.setdefault((layout.params[0].dtype, layout.params[0].device), []).append(i)
        self.wholes = []
        for (dtype, device), indices in kinds.items():
            whole = huge_page_zeros(sum(self.layouts[i].padded for i in indices), dtype, device)
            self.wholes.append(whole)
            offset = 0
            for i in indices:
                self.flats[i] = whole[offset:offset + self.layouts[i].padded]
                self.views[i] = self.layouts[i].split(self.flats[i])
                offset += self.layouts[i].padded

    @torch.no_grad()
    def attach(self) -> None:
        """Every ``p.grad`` a view of its buffer (allocated, zeroed, where :meth:`free` dropped it)."""
        fresh = not self.wholes
        if fresh:
            self._allocate()
        for i, layout in enumerate(self.layouts):
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
        if self.dirty:
            for whole in self.wholes:
                whole.zero_()
        for i, layout in enumerate(self.layouts):
            for p, view in zip(layout.params, self.views[i]):
                p.grad = view
        self.dirty = False

    def free(self) -> None:
        """Drop the buffers and the parameters' views of them."""
        for p in self.params:
            p.grad = None
        self.wholes = []
        self.flats = [None] * len(self.layouts)
        self.views = [[] for _ in self.layouts]

    def nbytes(self) -> int:
        """Bytes the allocated buffers hold."""
        return sum(w.numel() * w.element_size() for w in self.wholes)


@torch.no_grad()
def allreduce_flats(flats: list[torch.Tensor], compression: Any, name: str) -> None:
    """Average ``flats`` across ranks in place, one allreduce per buffer, one after the other: Horovod
    reduces a lone tensor where it lies, but copies the tensors of a grouped (or fused) allreduce
    into its fusion buffer and back (for the sharded optimizer's two group buffers that cost 30-60 ms
    more per update than one shared buffer, MiniLM on 2 ranks: hence :attr:`GradBuffers.wholes`).
    Float16 on the wire as Horovod's ``Compression.fp16`` does it: cast,
    averaged in float16, cast back."""
    fp16 = compression is hvd.Compression.fp16
    wire = [f.to(torch.float16) if fp16 and f.is_floating_point() else f for f in flats]
    for i, tensor in enumerate(wire):  # one buffer (data parallelism's, one dtype) keeps the plain name
        hvd.allreduce_(tensor, op=hvd.Average, name=name if len(wire) == 1 else f"{name}.{i}")  # distributed
    for flat, sent in zip(flats, wire):
        if sent is not flat:
            flat.copy_(sent)


@torch.no_grad()
def allgather_into(tensors: list[torch.Tensor], outputs: list[torch.Tensor], name: str) -> None:
    """Concatenate every rank's ``tensors[i]`` into ``outputs[i]`` (already of the whole size), one
    allgather per tensor, one after the other (a lone tensor is gathered straight into its output;
    a grouped one goes through Horovod's fusion buffer: see :func:`allreduce_flats`).

    Horovod's public ``grouped_allgather`` allocates new outputs on every call; for a whole model
    that allocation, page-faulted as the collective writes it, cost more than the transfer: an
    allgather of MiniLM's 22.7 M float32 took 132 ms (Gloo) and 49 ms (MPI) into a new tensor, 39
    and 12 ms into a kept one (``benchmarks/workers/zero2_collectives.py``, 2 ranks). So the
    outputs come from the caller, through the function Horovod's own ``allgather_async`` calls (a
    private name of the Horovod pinned in setup.cfg, 0.28.1: it resizes the output to the gathered
    shape, a no-op at the right size)."""
    from horovod.torch.mpi_ops import _allgather_async, global_process_set

    for i, (tensor, output) in enumerate(zip(tensors, outputs)):
        label = name if len(tensors) == 1 else f"{name}.{i}"
        hvd.synchronize(_allgather_async(tensor, output, label, global_process_set))  # distributed


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
            allreduce_flats(self.buffers.wholes, self.compression, "hvdtrain.flat.grads")
        return [p.grad for p in self.params]

    def after_update(self) -> None:
        """Data parallelism: zero the buffers for the next window and point ``p.grad`` at them."""
        if self.owns_zeroing:
            self.buffers.zero()

    def stepping(self) -> Any:
        """Nothing around ``optimizer.step()``: the gradients are reduced already."""
        return contextlib.nullcontext()
