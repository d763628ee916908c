"""Which gradient exchange a run uses: the one place that decides it, for both frameworks.

:func:`plan_exchange` reads the config (after the rulebook, :mod:`hvdtrain.core.rules`, allowed the
combination) and the workers' facts (:class:`Workers`) and returns an :class:`ExchangePlan`. Each
framework turns the plan into objects (:mod:`hvdtrain.torch.exchanges`,
:mod:`hvdtrain.tensorflow.exchanges`); the adapters hold what the factory built and never branch on
the plan's kind. The exchanges themselves are described in :mod:`hvdtrain.core.exchange`.

=============  ======================================================================================
kind           when
=============  ======================================================================================
``bitwise``    ``train.reproducible=world-size``: one fixed summation tree at any world size
``zero1``      ``parallel.shard_optimizer=optimizer``: optimizer state in 1/N slices
``zero2``      ``parallel.shard_optimizer=gradients``: the gradients reduce-scattered too
``powersgd``   ``comm.compression=powersgd``
``topk``       ``comm.compression=topk``
``local_sgd``  ``comm.local_sgd_steps`` above 1
``flat``       PyTorch data parallelism without overlap or Adasum, ``comm.flat_gradients``: one flat
               buffer per dtype averaged in place
``allreduce``  Horovod's allreduce (``hvd.DistributedOptimizer`` / the function
               ``hvd.DistributedGradientTape`` applies), average or Adasum, overlapped or not
=============  ======================================================================================

Float16 on the wire (``comm.compression=fp16``, or its older spelling ``train.fp16_allreduce``,
which with PowerSGD or top-k makes their factors or values travel as float16) is resolved here once,
into :attr:`ExchangePlan.fp16_wire`; the factories and the exchanges read only that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hvdtrain.core import reproducible
from hvdtrain.core.comm import overlap_gradients
from hvdtrain.core.compression import CommPlan, comm_plan
from hvdtrain.core.rules import fp16_allreduce

#: Every kind of exchange, in the order :func:`plan_exchange` considers them.
KINDS = ("bitwise", "zero1", "zero2", "powersgd", "topk", "local_sgd", "flat", "allreduce")

#: The frameworks whose data parallelism keeps its gradients in flat buffers (``comm.flat_gradients``).
FLAT_BUFFERS = ("torch",)


@dataclass(frozen=True)
class Workers:
    """What the plan needs to know about this process's job (read after ``hvd.init()``)."""

    size: int = 1  # the world size
    local_size: int = 1  # workers on this host
    gpu: bool = False  # this process trains on a GPU
    threads: int = 1  # this worker's intra-op threads
    cores: int = 1  # the host's cores


@dataclass(frozen=True)
class ExchangePlan:
    """The gradient exchange a run uses (see the module docstring)."""

    kind: str
    fp16_wire: bool = False  # gradients (PowerSGD's factors, top-k's values, ZeRO's buffers) travel as float16
    adasum: bool = False  # Horovod's Adasum instead of the average (only with kind ``allreduce``, 2+ workers)
    overlap: bool = False  # each gradient's allreduce starts during the backward pass (kind ``allreduce`` only)
    comm: CommPlan | None = None  # PowerSGD, top-k and local SGD settings (those kinds only)

    @property
    def sharded(self) -> bool:
        """Whether the optimizer state lives in 1/N slices (ZeRO-1 or ZeRO-2)."""
        return self.kind in ("zero1", "zero2")


def plan_exchange(config: Any, workers: Workers) -> ExchangePlan:
    """The exchange ``config`` asks for on ``workers`` (the rulebook has refused the combinations
    that cannot run, so the first matching kind of :data:`KINDS` is the one)."""
    fp16 = fp16_allreduce(config)
    if reproducible.enabled(config):
        return ExchangePlan("bitwise")
    shard = config.parallel.shard_optimizer
    if shard != "none":
        return ExchangePlan("zero2" if shard == "gradients" else "zero1", fp16_wire=fp16)
    comm = comm_plan(config)
    if comm is not None:
        return ExchangePlan(comm.method, fp16_wire=fp16, comm=comm)
    adasum = config.comm.reduction == "adasum" and workers.size > 1
    flat_buffer = config.framework in FLAT_BUFFERS and config.comm.flat_gradients and not adasum
    overlap = overlap_gradients(config.comm, workers.gpu, workers.local_size, workers.threads, workers.cores,
                                flat_buffer)
    flat = flat_buffer and not overlap
    return ExchangePlan("flat" if flat else "allreduce", fp16_wire=fp16, adasum=adasum, overlap=overlap)


def describe(plan: ExchangePlan) -> str:
    """One line naming the exchange, e.g. ``zero2 (fp16 on the wire)``."""
    extras = [what for what, on in (("fp16 on the wire", plan.fp16_wire), ("adasum", plan.adasum),
                                    ("overlapped with the backward pass", plan.overlap)) if on]
    return plan.kind + (f" ({', '.join(extras)})" if extras else "")
