"""``train.compile`` for TensorFlow: the forward and the gradient compiled by XLA.

:func:`gradient_function` wraps the adapter's compute part (forward, loss, ``tape.gradient``) in
an inner ``tf.function(jit_compile=True)``; the step's outer ``tf.function`` keeps the gradient
exchange (Horovod's allreduce, PowerSGD/top-k, local SGD), the finite check and the optimizer
update outside XLA. Horovod's collectives are TensorFlow custom operations, not XLA ones: its XLA
lowering (``horovod/tensorflow/xla_mpi_ops.cc``, opt-in with ``HOROVOD_ENABLE_XLA_OPS=1``) is built
only into GPU builds (CUDA/ROCm custom calls), so a CPU step with the collectives inside the XLA
cluster would not compile; outside it, the exchange is the same graph as eagerly. Model and optimizer variables are
the same ``tf.Variable`` objects either way: checkpoints do not change.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf


def gradient_function(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """``fn`` itself for ``mode='none'``; else ``fn`` compiled by XLA (any other mode: the
    rulebook lets only ``default`` through for TensorFlow)."""
    if mode == "none":
        return fn
    return tf.function(fn, jit_compile=True, reduce_retracing=True, autograph=False)


def describe(mode: str) -> str | None:
    """What the compile-time line names; None when eager."""
    return None if mode == "none" else "XLA jit_compile, forward and gradient"
