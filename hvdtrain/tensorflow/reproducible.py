"""Bitwise mode's exchange in TensorFlow (``train.reproducible=world-size``; the plan is
:mod:`hvdtrain.core.reproducible`, torch's twin :mod:`hvdtrain.torch.reproducible`).

:class:`TreeExchange` runs each micro-batch itself (:meth:`~TreeExchange.train_step`, which the
adapter's ``train_step`` hands over to): the traced gradient of one micro-batch, kept with the
model's floating-point non-trainable variables (BatchNorm's moving statistics) as one flat float32
row; at the update's last micro-batch the rows are summed along the plan's fixed tree (this worker's
block first when it is a node, the blocks or every row allgathered, the same tree on every worker),
the moving statistics set to their mean over the micro-batches, and the adapter's own traced update
(finite check, clipping, the optimizer) applied to the summed gradient. Before each micro-batch
(:meth:`~TreeExchange.begin_micro_batch`) the moving statistics go back to the update's start and
every layer's seed state is keyed by the micro-batch's seed, so dropout draws the same masks at any
world size.
"""

from __future__ import annotations

import os
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvdtrain.core import reproducible
from hvdtrain.core.adapter import NonFiniteGradientError
from hvdtrain.core.exchange import Stateless
from hvdtrain.tensorflow.compression import tf_variables


def enter(config: Any) -> None:
    """What bitwise mode fixes before TensorFlow starts: intra-op threads and deterministic ops."""
    threads = reproducible.threads(config)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    os.environ.setdefault("TF_DETERMINISTIC_OPS", "1")
    tf.config.experimental.enable_op_determinism()


class TreeExchange(Stateless):
    """Per-micro-batch gradients and moving statistics, summed along a fixed tree (module docstring)."""

    buffers_agree = True  # every worker leaves the same moving statistics: nothing to average before evaluating

    def __init__(self, adapter: Any, accumulation: int) -> None:
        self.adapter, self.accumulation = adapter, accumulation
        self.variables = tf_variables(adapter.trainable)
        self.buffers = list(adapter.buffers)
        self.rows: list[tf.Tensor] = []
        self.start: list[np.ndarray] | None = None
        self._gradient = tf.function(self._micro_batch, reduce_retracing=True, autograph=False)
        self._update = tf.function(adapter._update, reduce_retracing=True, autograph=False)

    def _micro_batch(self, inputs: Any, targets: Any, weight: Any) -> Any:
        loss, grads = self.adapter._gradients(inputs, targets, weight)
        parts = [tf.reshape(tf.cast(tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v), tf.float32), [-1])
                 for g, v in zip(grads, self.variables)]
        parts += [tf.reshape(tf.cast(b, tf.float32), [-1]) for b in self.buffers]
        return loss, tf.concat(parts, axis=0)

    def begin_micro_batch(self, seed: int) -> None:
        """A micro-batch is about to run: the moving statistics back to the update's start, and every
        layer's seed state keyed by ``seed`` (layer ``i``: ``[seed, i]``... counters from 0)."""
        if self.start is None:
            self.start = [np.array(b.numpy()) for b in self.buffers]
        for buffer, value in zip(self.buffers, self.start):
            buffer.assign(value)
        for i, state in enumerate(self.adapter._seed_states()):
            state.assign(np.asarray([(seed + i * 7919) % 2**31, 0], dtype=np.dtype(getattr(state.dtype, "name", state.dtype))))

    def train_step(self, inputs: Any, targets: Any, apply_update: bool, weight: float) -> Any:
        """One micro-batch; with ``apply_update`` the tree sum and the update (a collective)."""
        loss, row = self._gradient(inputs, targets, tf.constant(weight, dtype=tf.float32))
        self.rows.append(row)
        if apply_update:
            self._apply()
        return loss.numpy()

    def restart(self, accumulation: int) -> None:
        """A fresh update of ``accumulation`` micro-batches on this worker (an elastic sync): the
        rows and statistics of an update cut short are dropped (the model's were rolled back)."""
        self.accumulation, self.rows, self.start = accumulation, [], None

    def _apply(self) -> None:
        local = self.rows
        if reproducible.blocks_are_nodes(self.accumulation):
            mine = tf.expand_dims(reproducible.tree_sum(local, tf.add), 0)
        else:
            mine = tf.stack(local)
        rows = hvd.allgather(mine, name="hvdtrain.tree_rows") if hvd.size() > 1 else mine  # distributed
        total = reproducible.tree_sum(tf.unstack(rows), tf.add)
        micro = self.accumulation * hvd.size()
        grads, offset = [], 0
        for v in self.variables:
            n = int(np.prod(v.shape))
            grads.append(tf.cast(tf.reshape(total[offset:offset + n], v.shape), v.dtype))
            offset += n
        for buffer in self.buffers:
            n = int(np.prod(buffer.shape))
            buffer.assign(tf.cast(tf.reshape(total[offset:offset + n] / micro, buffer.shape), buffer.dtype))
            offset += n
        self.rows, self.start = [], None
        adapter = self.adapter
        if adapter._lr_variable is not None:
            adapter._lr_variable.assign(adapter._lr)
        if not bool(self._update(grads)):
            if adapter.nonfinite == "error":
                raise NonFiniteGradientError("the summed gradient is not finite")
            adapter.skipped_updates += 1
