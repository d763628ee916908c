"""Optimizer state (ZeRO-1, ``parallel.shard_optimizer=optimizer``) and gradients (ZeRO-2,
``=gradients``) sharded across ranks on Horovod's collectives, for PyTorch.

Each of the recipe optimizer's parameter groups is laid out as one flat buffer: its trainable
parameters concatenated in order, zero-padded to a multiple of the world size ``N``
(:class:`~hvdtrain.torch.flat_buffers.FlatLayout`; the buffers are
:class:`~hvdtrain.torch.flat_buffers.GradBuffers`, the same mechanism as data parallelism's). Rank ``r`` owns the ``r``-th ``1/N`` slice of every buffer and keeps the
optimizer state of that slice only: a copy of the recipe's optimizer (same class, same
hyperparameters per group) over each group's slice, a contiguous tensor stepped as chunks of
:data:`CHUNK_ELEMENTS` (views of it). One update:

1. :class:`~hvdtrain.torch.flat_buffers.FlatAllreduce` (the run's gradient exchange) averages the flat gradient buffers
   (the groups' buffers are views of one allocation) with one in-place allreduce and leaves the averaged gradients in each ``p.grad``, so the adapter's finite
   check, global-norm clipping and loss-scaler unscaling see the same gradients as under data
   parallelism;
2. :meth:`ShardedOptimizer.step` steps the shard optimizer on this rank's slice of the (clipped)
   gradients, then an allgather of the updated slices per group, into buffers it allocates on huge
   pages (:mod:`hvdtrain.torch.host_memory`), writes the whole model back on every rank.

Where the extra cost went (MiniLM, 2 ranks, Gloo; ``benchmarks/workers/zero2_collectives.py`` and the
``--phases`` of ``benchmarks/workers/sharded_memory.py``): more than the bytes moved, new large
buffers cost their page faults every update. Gathering into a new tensor took 132 ms against 39 ms
into an allocated one; AdamW on one 11.35 M-element shard 56 ms against 17 ms in chunks; the two
group buffers' grouped allreduce copied through Horovod's fusion buffer (30-60 ms) where one
allocation is reduced in place; ZeRO-2's gradient buffer, allocated again every update, 33-40 ms
on ordinary pages against 5 ms on huge pages.

With ``gradients`` (ZeRO-2) :class:`FlatReduceScatter` replaces step 1: it leaves each rank the
averaged gradient of its own slice only, as the shard's ``.grad`` (on CPUs one in-place allreduce
of the whole buffers, each rank copying its slice into a shard gradient kept from update to update; on GPUs a reduce-scatter in pieces whose copies
inside Horovod stay small: see the class); the whole flat buffers are freed right after it and allocated again (zeroed) by
:meth:`ShardedOptimizer.attach_grads` before the next backward pass. The adapter's update then works
on the shards: :attr:`ShardedOptimizer.param_groups` are the shard optimizer's groups (the loss
scaler unscales the shard, clipping scales it), the gradient norm is the global one
(:meth:`FlatReduceScatter.global_norm`: the squared shard norms summed across ranks; padding zeros add
nothing), and a non-finite value in any rank's shard (or an fp16 overflow found on any rank, see
:meth:`FlatReduceScatter.agree_on_overflow`) skips the update on every rank. Gradient accumulation
sums the micro-batches in the whole buffers locally and reduce-scatters once per update. Memory: a
whole-size gradient buffer still lives through the backward pass (no bucketing: the reduce-scatter
runs once, after it); between the exchange and the next backward pass a rank holds ``1/N`` of the
gradients.

The update is the data-parallel one element by element, because the optimizers allowed
(:data:`ELEMENTWISE`) update each element from that element's gradient and state alone; an optimizer
that mixes elements (Adafactor's factored moments, LAMB's per-tensor trust ratio) would see flat
slices instead of tensors, and is refused.

**Checkpoints keep today's format.** Before rank 0 writes one, every rank takes part in
:meth:`ShardedOptimizer.gather` (one grouped allgather per state key), which rebuilds the recipe
optimizer's own ``state_dict()`` on rank 0: a sharded run's checkpoint resumes under data parallelism
and the other way round, and at any world size. On resume rank 0 loads that state into the recipe's
optimizer; :meth:`ShardedOptimizer.broadcast` sends it to every rank, each keeps its slice, and the
full copy is dropped.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import horovod.torch as hvd
import torch

from hvdtrain.core.config import ConfigError
from hvdtrain.core.exchange import Stateless
from hvdtrain.torch.flat_buffers import FlatAllreduce, FlatLayout, GradBuffers, allgather_into, allreduce_flats
from hvdtrain.torch.host_memory import huge_page_zeros

__all__ = ["FlatLayout", "FlatReduceScatter", "ShardedOptimizer", "check_optimizer", "zero1_exchange"]

#: ZeRO-2 reduce-scatters the flat gradients in pieces of about this many elements (16 MiB of float32).
SCATTER_ELEMENTS = 1 << 22

#: The shard optimizer steps each shard as chunks of at most this many elements (4 MiB of float32),
#: views of it: torch's CPU optimizers make temporaries the size of each tensor they update, and one
#: 11.35 M-element shard (MiniLM's on 2 ranks) took AdamW 56 ms per step against 17 ms in chunks of
#: this size (a new large temporary is page-faulted in every step; small ones are reused).
CHUNK_ELEMENTS = 1 << 20

#: Optimizers whose update of an element depends on that element's gradient and state only.
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad")


def check_optimizer(optimizer: torch.optim.Optimizer, mode: str = "optimizer") -> None:
    """Refuse an optimizer whose update is not element by element (see the module docstring)."""
    name = type(optimizer).__name__
    if name not in ELEMENTWISE:
        raise ConfigError(f"parallel.shard_optimizer={mode}: the recipe's optimizer {name} is not one whose "
                          f"update works element by element on a flat slice; use one of {', '.join(ELEMENTWISE)}, "
                          f"or parallel.shard_optimizer=none")


class ShardedOptimizer:
    """The recipe's ``optimizer`` with its state sharded across the ranks (ZeRO-1).

    It answers what the adapter asks of an optimizer: ``param_groups`` (the recipe optimizer's own:
    the learning rate is set there), ``step``, ``zero_grad``, ``state``, ``state_dict`` and
    ``load_state_dict`` (the recipe optimizer's whole state, see :meth:`gather`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, gradients: bool = False) -> None:
        check_optimizer(optimizer, "gradients" if gradients else "optimizer")
        self.optimizer = optimizer  # holds the hyperparameters; its state only while loading or saving
        self.gradients = gradients  # ZeRO-2: only the shard's gradients outlive the exchange
        self.size, self.rank = hvd.size(), hvd.rank()
        self.layouts: list[FlatLayout] = []
        shards, chunks, groups = [], [], []
        with torch.no_grad():
            for group in optimizer.param_groups:
                params = [p for p in group["params"] if p.requires_grad]
                if not params:
                    raise ConfigError("parallel.shard_optimizer: a parameter group has no trainable parameter")
                layout = FlatLayout(params, self.size, self.rank)
                shard = torch.nn.Parameter(layout.mine(layout.flatten([p.detach() for p in params])).clone())
                self.layouts.append(layout)
                shards.append(shard)
                # the shard optimizer updates chunks that are views of the shard (see CHUNK_ELEMENTS)
                chunks.append([torch.nn.Parameter(piece) for piece in torch.split(shard.detach(), CHUNK_ELEMENTS)])
                groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": chunks[-1]})
        self.shards = shards  # this rank's slice of each group's flat buffer, one contiguous tensor each
        self.chunks = chunks  # the shard optimizer's parameters, per group: views of the group's shard
        # the gradients live in one flat buffer per group: each p.grad is a view of it, so the backward
        # pass accumulates into the buffer and the exchange averages it in place (no copies)
        self.grads = GradBuffers(self.layouts)
        accepted = inspect.signature(type(optimizer).__init__).parameters  # AdamW's defaults hold more
        self.inner = type(optimizer)(groups, **{k: v for k, v in optimizer.defaults.items() if k in accepted})
        self._full: dict[str, Any] | None = None  # rank 0, between gather() and state_dict()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The groups whose ``params`` hold the gradients the update applies, and whose
        hyperparameters are set by the schedule: the recipe optimizer's (the whole parameters) for
        ZeRO-1, the shard optimizer's (this rank's flat slices) for ZeRO-2."""
        return self.inner.param_groups if self.gradients else self.optimizer.param_groups

    @property
    def state(self) -> Any:
        """This rank's shard state, per chunk (empty before the first update)."""
        return self.inner.state

    def _shard_state(self, g: int) -> dict[str, Any]:
        """Group ``g``'s shard state as one entry: its chunks' 1-D state tensors concatenated, the
        scalars (``step``) of its first chunk; empty before the first update."""
        states = [self.inner.state.get(chunk, {}) for chunk in self.chunks[g]]
        if not states[0]:
            return {}
        return {k: torch.cat([st[k] for st in states]) if torch.is_tensor(v) and v.dim() == 1 else v
                for k, v in states[0].items()}

    def _set_shard_state(self, g: int, entry: dict[str, Any]) -> None:
        """Give group ``g``'s chunks their pieces of a shard-sized state ``entry`` (each chunk its own
        copy of the scalars: torch steps them in place)."""
        offset = 0
        for chunk in self.chunks[g]:
            n = chunk.numel()
            self.inner.state[chunk] = {k: v[offset:offset + n].clone() if torch.is_tensor(v) and v.dim() == 1
                                       else (v.clone() if torch.is_tensor(v) else v) for k, v in entry.items()}
            offset += n

    @property
    def grad_flats(self) -> list[torch.Tensor | None]:
        """The flat gradient buffers, one per group (None while ZeRO-2 has freed them)."""
        return self.grads.flats

    def attach_grads(self) -> None:
        """Make every ``p.grad`` a view of its group's flat buffer again (allocated, zeroed, when
        ZeRO-2 freed it)."""
        self.grads.attach()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffers (the gradients stay views of them); drop the shards'."""
        self.grads.zero()
        for shard, chunks in zip(self.shards, self.chunks):
            shard.grad = None
            for chunk in chunks:
                chunk.grad = None

    def set_shard_grads(self, grads: list[torch.Tensor]) -> None:
        """Each group's averaged gradient slice as its shard's ``.grad`` and, viewed, its chunks'."""
        for shard, chunks, grad in zip(self.shards, self.chunks, grads):
            shard.grad = grad
            for chunk, piece in zip(chunks, torch.split(grad, CHUNK_ELEMENTS)):
                chunk.grad = piece

    def free_grads(self) -> None:
        """ZeRO-2, after the reduce-scatter: drop the whole flat gradient buffers (and the
        parameters' views of them); :meth:`attach_grads` allocates them again."""
        self.grads.free()

    def gradient_bytes(self) -> int:
        """Bytes of gradients this rank holds now: the whole flat buffers while allocated, and
        the shards' gradients."""
        return self.grads.nbytes() + sum(s.grad.numel() * s.grad.element_size()
                                         for s in self.shards if s.grad is not None)

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's slice from the averaged gradients (ZeRO-1: in ``p.grad``, views of the
        flat buffers since :meth:`FlatAllreduce.reduce`; ZeRO-2: the shards' own, from
        :meth:`FlatReduceScatter.reduce`), then all-gather the updated slices into every parameter
        (a collective)."""
        if not self.gradients:
            self._copy_hyperparameters()  # the LR the schedule set
            self.set_shard_grads([layout.mine(flat) for layout, flat in zip(self.layouts, self.grad_flats)])
        self.inner.step()
        # the gathered model lands in new buffers on huge pages (cheap to fault in), freed once copied
        wholes = [layout.empty() for layout in self.layouts]
        allgather_into([s.detach() for s in self.shards], wholes, "hvdtrain.zero.params")  # distributed
        for layout, flat in zip(self.layouts, wholes):
            for p, value in zip(layout.params, layout.split(flat)):
                p.copy_(value)

    def _copy_hyperparameters(self) -> None:
        """The recipe optimizer's hyperparameters into the shard optimizer's groups."""
        for group, inner in zip(self.optimizer.param_groups, self.inner.param_groups):
            inner.update({k: v for k, v in group.items() if k != "params"})

    # -- the recipe optimizer's state, whole, for checkpoints ------------------------------------

    def _index(self) -> dict[int, int]:
        """``id(param) -> index`` in the recipe optimizer's ``state_dict()`` numbering."""
        order = [p for group in self.optimizer.param_groups for p in group["params"]]
        return {id(p): i for i, p in enumerate(order)}

    @torch.no_grad()
    def gather(self) -> None:
        """Every rank: bring the shards' state together; rank 0 keeps it as the recipe optimizer's
        ``state_dict()`` for :meth:`state_dict` (a collective: one grouped allgather)."""
        shard_states = [self._shard_state(g) for g in range(len(self.shards))]
        keys = sorted({k for st in shard_states for k, v in st.items() if torch.is_tensor(v) and v.dim() == 1})
        tensors = [st[k] if k in st else torch.zeros_like(shard)
                   for shard, st in zip(self.shards, shard_states) for k in keys]
        whole = hvd.grouped_allgather(tensors, name="hvdtrain.zero.state") if tensors else []  # distributed
        if self.rank != 0:
            return
        index, state = self._index(), {}
        flats = iter(whole)
        for layout, shard_state in zip(self.layouts, shard_states):
            scalars = {k: v for k, v in shard_state.items() if not (torch.is_tensor(v) and v.dim() == 1)}
            per_key = {k: layout.split(next(flats)) for k in keys}
            for i, p in enumerate(layout.params):
                if shard_state:  # each parameter its own copy of the scalars: torch steps them in place
                    state[index[id(p)]] = {**{k: v.clone() if torch.is_tensor(v) else v for k, v in scalars.items()},
                                           **{k: per_key[k][i].clone() for k in keys}}
        groups = []
        for group, hyper in zip(self.optimizer.param_groups, self.param_groups):  # the hyperparameters in force
            groups.append({**{k: v for k, v in hyper.items() if k != "params"},
                           "params": [index[id(p)] for p in group["params"]]})
        self._full = {"state": state, "param_groups": groups}

    def state_dict(self) -> dict[str, Any]:
        """The recipe optimizer's whole ``state_dict()`` (rank 0, after :meth:`gather`)."""
        if self._full is None:
            raise RuntimeError("ShardedOptimizer.state_dict: gather() must run on every rank first")
        full, self._full = self._full, None
        return full

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rank 0, on resume: the recipe optimizer's whole state (any world size, sharded or not);
        :meth:`broadcast` shares it out."""
        self.optimizer.load_state_dict(state)

    @torch.no_grad()
    def _take_parameters(self) -> None:
        """Each shard's values from the parameters (after they were loaded or broadcast)."""
        for layout, shard in zip(self.layouts, self.shards):
            shard.copy_(layout.mine(layout.flatten([p.detach() for p in layout.params])))

    @torch.no_grad()
    def broadcast(self, root_rank: int = 0) -> None:
        """Every rank, after the parameters were broadcast: take this rank's slice of the parameters
        and of the root's whole optimizer state (what it loaded; a fresh start has none), and drop
        the whole copy (a collective)."""
        full = hvd.broadcast_object(self.optimizer.state_dict() if self.rank == root_rank else None,  # distributed
                                    root_rank=root_rank, name="hvdtrain.zero.load")
        self.optimizer.state.clear()
        self.inner.state.clear()
        self._copy_hyperparameters()
        self._take_parameters()
        if not full["state"]:
            return
        index = self._index()
        for g, (layout, shard) in enumerate(zip(self.layouts, self.shards)):
            states = [full["state"].get(index[id(p)], {}) for p in layout.params]
            present = [s for s in states if s]
            if not present:
                continue
            entry: dict[str, Any] = {}
            for key, value in present[0].items():
                if torch.is_tensor(value) and value.dim() > 0:
                    tensors = [s[key].to(shard.device, shard.dtype) if key in s else None for s in states]
                    entry[key] = layout.mine(layout.flatten(tensors))
                else:
                    entry[key] = value
            self._set_shard_state(g, entry)  # each chunk its own copy


def zero1_exchange(optimizer: "ShardedOptimizer", compression: Any) -> FlatAllreduce:
    """ZeRO-1's gradient exchange: each parameter group's gradients averaged as one flat buffer (one
    grouped allreduce per update, in place, optional float16 on the wire)."""
    return FlatAllreduce(optimizer.grads, optimizer.grads.params, compression)


class FlatReduceScatter(Stateless):
    """ZeRO-2's gradient exchange: each rank keeps the averaged gradient of its own slice of every
    parameter group's flat buffer (op Average, optional float16 on the wire); the whole buffers are
    freed.

    How the slices are averaged depends on the device (``by_allreduce``, None: by device). On GPUs a
    reduce-scatter (NCCL's moves half an allreduce's bytes), in pieces of :data:`SCATTER_ELEMENTS`.
    On CPUs one in-place allreduce of the whole buffers, each rank then keeping its slice: Horovod's
    Gloo reduce-scatter took 2.5x the CPU time of its allreduce of the same buffer, and under MPI
    (Open MPI on one host) 1.5x (97 ms against 64 ms for MiniLM's 22.7 M float32 on 2 ranks,
    benchmarks/workers/zero2_collectives.py), and the allreduce needs no piece copies; the memory
    held outside the exchange is the same 1/N."""

    #: True: allreduce and keep the slice; False: reduce-scatter; None: allreduce on CPUs only.
    by_allreduce: bool | None = None

    def __init__(self, optimizer: "ShardedOptimizer", compression: Any) -> None:
        self.optimizer, self.compression = optimizer, compression
        self._shard_grads: list[torch.Tensor] | None = None  # see _kept()

    def stepping(self) -> Any:
        """Nothing around ``optimizer.step()``: the sharded optimizer is stepped directly."""
        return contextlib.nullcontext()

    @torch.no_grad()
    def reduce(self, grads: list[Any]) -> list[Any]:
        """Every rank's gradients averaged into this rank's shards' ``.grad`` (a collective); returns
        those shard gradients (what the adapter unscales, checks, clips and applies)."""
        optimizer = self.optimizer
        optimizer.attach_grads()
        flats = optimizer.grad_flats
        by_allreduce = self.by_allreduce if self.by_allreduce is not None else not flats[0].is_cuda
        if optimizer.size > 1 and by_allreduce:
            allreduce_flats(optimizer.grads.wholes, self.compression, "hvdtrain.zero.grads")  # distributed
        if optimizer.size > 1 and not by_allreduce:
            mine = [self._scatter(i, layout, flat) for i, (layout, flat) in enumerate(zip(optimizer.layouts, flats))]
        else:  # this rank's slice, copied into the shard gradients kept from update to update
            mine = [kept.copy_(layout.mine(flat)) for kept, layout, flat in
                    zip(self._kept(), optimizer.layouts, optimizer.grad_flats)]
        optimizer.free_grads()
        optimizer.set_shard_grads(mine)
        return [shard.grad for shard in optimizer.shards]

    def _kept(self) -> list[torch.Tensor]:
        """One shard-sized gradient buffer per group, allocated at the first update and kept (a new
        one per update cost its page faults every time; the 1/N gradients outlive the exchange
        anyway)."""
        if self._shard_grads is None:
            self._shard_grads = [huge_page_zeros(layout.shard, layout.params[0].dtype, layout.params[0].device)
                                 for layout in self.optimizer.layouts]
        return self._shard_grads

    @torch.no_grad()
    def _scatter(self, index: int, layout: FlatLayout, flat: torch.Tensor) -> torch.Tensor:
        """This rank's averaged slice of ``flat``, reduce-scattered in pieces of about
        :data:`SCATTER_ELEMENTS` (a collective each): the buffer seen as ``N`` rows, one per rank's
        slice, cut into column blocks, so each rank still receives its own contiguous slice; Horovod
        copies what it reduces, and a piece at a time that copy stays small."""
        size = self.optimizer.size
        rows, out = flat.view(size, layout.shard), torch.empty(layout.shard, dtype=flat.dtype, device=flat.device)
        width = max(1, SCATTER_ELEMENTS // size)
        for start in range(0, layout.shard, width):
            piece = rows[:, start:start + width].contiguous()
            if self.compression is hvd.Compression.fp16:
                piece = piece.to(torch.float16)
            got = hvd.reducescatter(piece, op=hvd.Average, name=f"hvdtrain.zero.grads.{index}.{start}")  # distributed
            out[start:start + width] = got.reshape(-1)
        return out

    def global_norm(self, local: torch.Tensor) -> torch.Tensor:
        """The norm of the whole gradient from this rank's shard norm ``local``: the squared shard
        norms summed across ranks (a collective; a non-finite shard makes it non-finite on every
        rank)."""
        if self.optimizer.size == 1:
            return local
        squared = local.detach().double().square()
        return hvd.allreduce(squared, op=hvd.Sum, name="hvdtrain.zero.norm").sqrt().to(local.dtype)  # distributed

    def agree_on_overflow(self, scaler: Any) -> None:
        """fp16: the loss scaler found overflows in this rank's shard only; sum its findings across
        ranks so every rank skips (or applies) the update and lowers the scale alike (a collective)."""
        if self.optimizer.size == 1:
            return
        found = scaler._per_optimizer_states[id(self.optimizer)]["found_inf_per_device"]
        for device in sorted(found, key=str):
            found[device] = hvd.allreduce(found[device], op=hvd.Sum, name=f"hvdtrain.zero.found_inf.{device}")
