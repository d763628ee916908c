"""Less communication, described once for both frameworks: PowerSGD and top-k gradient compression
with error feedback, and local SGD (periodic parameter averaging).

This module holds what does not depend on the framework: which option a config selects (what it
may not be combined with is in :mod:`hvdtrain.core.rules`), how a gradient
is viewed as a matrix, its PowerSGD rank and the seeded initial ``Q``, how many entries top-k
keeps, and when local SGD averages. The arithmetic runs in :mod:`hvdtrain.torch.compression` and
:mod:`hvdtrain.tensorflow.compression`, which follow the same steps so that both frameworks give
the same update on the same gradients; each is a gradient exchange (:mod:`hvdtrain.core.exchange`)
that both adapters call at the same points of their update.

PowerSGD (Vogels et al., NeurIPS 2019; as PyTorch's ``powerSGD_hook``), per gradient matrix ``G``
(``rows`` = the output dimension, the rest flattened) on every worker ``i``::

    M_i = G_i + E_i                      # error feedback: add what was not sent last time
    P   = allreduce_mean(M_i gram_schmidt(Q))  # Q: warm-started from the previous step (seeded at first)
    P   = gram_schmidt(P)                # orthonormal columns
    Q   = allreduce_mean(M_i^T P)        # all P's in one grouped allreduce, then all Q's in another
    A   = P Q^T                          # the applied (averaged, approximated) gradient
    E_i = M_i - A                        # what this worker still owes

Gradients with fewer than ``comm.powersgd_min_size`` elements, vectors, and every gradient during
the first ``comm.powersgd_start_step`` steps go through a plain averaging allreduce (in the same
grouped allreduce as the P's). With ``train.fp16_allreduce`` the factors travel as float16.

Top-k, per gradient: ``M_i = G_i + E_i``; worker ``i`` sends the ``k`` largest-magnitude entries of
``M_i`` (values and flat indices, all tensors in one ``allgather`` each); every worker scatter-adds
what all sent and divides by the world size: ``A``; ``E_i = M_i - (M_i at the sent entries)``.

In both, summed over steps, the applied gradients plus the mean of the workers' residuals equal
the mean of the true gradients: nothing is lost, only delayed.

Local SGD (periodic model averaging): every worker applies its own gradients; after every
``comm.local_sgd_steps`` updates (and before each evaluation) all floating-point model variables
(and, with ``comm.local_sgd_average_optimizer``, the optimizer's) are averaged in one grouped
allreduce. ``local_sgd_steps=1`` is synchronous SGD: the ordinary gradient allreduce.

State that a resumed run needs (error buffers, ``Q``, step counters, and under local SGD each
worker's own parameters and optimizer state between averagings) is per worker; the checkpoint
keeps every worker's copy (:mod:`hvdtrain.core.compression_state`; the keys, the same in both
frameworks, are listed in :mod:`hvdtrain.core.exchange`). A different world size, or an elastic
re-formation, starts it afresh and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvdtrain.core.rules import fp16_allreduce

#: Seed of the random initial Q matrices (the same on every worker and in both frameworks).
Q_SEED = 20190501


@dataclass(frozen=True)
class CommPlan:
    """What a run's ``comm`` (and ``train.fp16_allreduce``) section asks of the gradient exchange."""

    method: str  # "powersgd", "topk" or "local_sgd"
    fp16_wire: bool = False
    powersgd_rank: int = 4
    powersgd_start_step: int = 0
    powersgd_min_size: int = 4096
    topk_ratio: float = 0.01
    local_sgd_steps: int = 1
    local_sgd_average_optimizer: bool = False


def comm_plan(config: Any) -> CommPlan | None:
    """The exchange hvdtrain runs itself, or None where Horovod's own allreduce does the job
    (``none``/``fp16``, and local SGD with H=1)."""
    comm = config.comm
    fp16 = fp16_allreduce(config)
    common = dict(fp16_wire=fp16, powersgd_rank=comm.powersgd_rank, powersgd_start_step=comm.powersgd_start_step,
                  powersgd_min_size=comm.powersgd_min_size, topk_ratio=comm.topk_ratio,
                  local_sgd_steps=comm.local_sgd_steps,
                  local_sgd_average_optimizer=comm.local_sgd_average_optimizer)
    if comm.compression in ("powersgd", "topk"):
        return CommPlan(method=comm.compression, **common)
    if comm.local_sgd_steps > 1:
        return CommPlan(method="local_sgd", **common)
    return None


def matrix_shape(logical_shape: tuple[int, ...]) -> tuple[int, int]:
    """The matrix PowerSGD compresses for a gradient whose *logical* shape is ``(out, in, k...)``
    (PyTorch's layout; TensorFlow kernels are transposed to it first): ``out`` rows, the rest as
    columns (convolution kernels reshaped)."""
    rows = int(logical_shape[0])
    return rows, int(np.prod(logical_shape[1:], dtype=np.int64))


def compressible(logical_shape: tuple[int, ...], plan: CommPlan) -> bool:
    """Whether PowerSGD compresses this gradient: a matrix or higher (kernels reshaped) with at
    least ``powersgd_min_size`` elements."""
    return len(logical_shape) >= 2 and int(np.prod(logical_shape, dtype=np.int64)) >= plan.powersgd_min_size


def effective_rank(n: int, m: int, rank: int) -> int:
    """PowerSGD's rank for an ``n`` x ``m`` matrix: the configured rank, at most ``min(n, m)``."""
    return max(1, min(n, m, rank))


def initial_q(index: int, m: int, r: int) -> np.ndarray:
    """The seeded initial ``Q`` (``m`` x ``r``, float32) of the ``index``-th compressed gradient:
    the same on every worker and in both frameworks."""
    rng = np.random.default_rng([Q_SEED, index])
    return rng.standard_normal((m, r)).astype(np.float32)


def topk_count(numel: int, ratio: float) -> int:
    """How many entries top-k sends for a gradient of ``numel`` elements (at least one)."""
    return max(1, min(numel, int(math.ceil(ratio * numel))))


def averaging_due(updates_since_average: int, plan: CommPlan) -> bool:
    """Local SGD: whether the parameters are averaged after this many local updates."""
    return updates_since_average >= plan.local_sgd_steps


def describe(plan: CommPlan | None) -> str:
    """One line naming the exchange (printed at start by rank 0)."""
    if plan is None:
        return ""
    wire = " (fp16 on the wire)" if plan.fp16_wire else ""
    if plan.method == "powersgd":
        return (f"PowerSGD rank {plan.powersgd_rank}{wire}, tensors under {plan.powersgd_min_size} elements and the "
                f"first {plan.powersgd_start_step} steps uncompressed")
    if plan.method == "topk":
        return f"top-k {plan.topk_ratio:g} of each gradient{wire} with error feedback"
    return (f"local SGD: parameters{' and optimizer state' if plan.local_sgd_average_optimizer else ''} averaged "
            f"every {plan.local_sgd_steps} steps")
