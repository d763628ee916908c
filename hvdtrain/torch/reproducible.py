"""Bitwise mode's exchange in torch (``train.reproducible=world-size``; the plan is
:mod:`hvdtrain.core.reproducible`).

:class:`TreeExchange` keeps each micro-batch's gradient apart: before the next micro-batch begins
(:meth:`~TreeExchange.begin_micro_batch`, called by the loop) and when the update combines
(:meth:`~TreeExchange.reduce`), it moves the ``p.grad`` the backward pass left, together with the
model's floating-point buffers (BatchNorm's running statistics), into one flat float32 row, and
puts the buffers back to what they were when the update began. ``reduce`` then sums the rows along
the plan's fixed tree: this worker's block first when it is a node of the tree, the blocks (or every
row) allgathered from all workers, and the same tree over them on every worker. The result is the
update's gradient (each micro-batch's loss already weighted by its share of the global batch) and
the mean of the micro-batches' running statistics, the same bits at any world size.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import horovod.torch as hvd
import torch

from hvdtrain.core import reproducible
from hvdtrain.core.exchange import Stateless


def enter(config: Any) -> None:
    """What bitwise mode fixes in this process: intra-op threads and deterministic kernels."""
    torch.set_num_threads(reproducible.threads(config))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what cuBLAS needs to be deterministic
    torch.use_deterministic_algorithms(True)


class TreeExchange(Stateless):
    """Per-micro-batch gradients and running statistics, summed along a fixed tree (module docstring)."""

    buffers_agree = True  # every worker leaves the same running statistics: nothing to average before evaluating

    def __init__(self, model: torch.nn.Module, params: list[torch.Tensor], accumulation: int) -> None:
        self.params, self.accumulation = params, accumulation
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.counters = [b for b in model.buffers() if not b.is_floating_point()]  # num_batches_tracked
        self.rows: list[torch.Tensor] = []  # this worker's micro-batches of the update so far
        self.start: list[torch.Tensor] | None = None  # the buffers when the update began
        self.pending = False  # a micro-batch ran since the last row was taken

    def begin_micro_batch(self, seed: int) -> None:
        """A micro-batch is about to run: keep the previous one's row, reset the running statistics
        (``seed``: the loop reseeds torch with it, which is all torch's dropout reads)."""
        if self.start is None:
            self.start = [b.detach().clone() for b in (*self.buffers, *self.counters)]
        self._take_row()
        with torch.no_grad():  # counters too: after the update they hold the update's start + 1 on every worker
            for buffer, value in zip((*self.buffers, *self.counters), self.start):
                buffer.copy_(value)
        self.pending = True

    def _take_row(self) -> None:
        if not self.pending:
            return
        parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1) for p in self.params]
        parts += [b.detach().reshape(-1) for b in self.buffers]
        self.rows.append(torch.cat([t.to(torch.float32) for t in parts]))
        for p in self.params:
            p.grad = None
        self.pending = False

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The update's gradient in each ``p.grad`` (and the running statistics), the same bits on
        every worker at any world size (a collective: one allgather)."""
        self._take_row()
        local = torch.stack(self.rows)
        if reproducible.blocks_are_nodes(self.accumulation):
            mine = reproducible.tree_sum(list(local), torch.add).unsqueeze(0)  # this block: a node of the tree
        else:
            mine = local  # every micro-batch's row travels
        rows = hvd.allgather(mine, name="hvdtrain.tree_rows") if hvd.size() > 1 else mine  # distributed
        total = reproducible.tree_sum(list(rows), torch.add)
        micro = self.accumulation * hvd.size()
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = total[offset:offset + n].view_as(p).to(p.dtype).clone()
            offset += n
        with torch.no_grad():
            for buffer in self.buffers:
                n = buffer.numel()
                buffer.copy_((total[offset:offset + n] / micro).view_as(buffer))
                offset += n
        self.rows, self.start = [], None
        return [p.grad for p in self.params]

    def restart(self, accumulation: int) -> None:
        """A fresh update of ``accumulation`` micro-batches on this worker (an elastic sync): the
        rows and statistics of an update cut short are dropped (the model's were rolled back)."""
        self.accumulation, self.rows, self.start, self.pending = accumulation, [], None, False
        for p in self.params:
            p.grad = None

    def stepping(self) -> Any:
        """Nothing around the optimizer's step."""
        return contextlib.nullcontext()
