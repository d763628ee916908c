"""PowerSGD and top-k gradient compression with error feedback, and local SGD, for TensorFlow on
Horovod collectives (the algorithms are described in :mod:`hvdtrain.core.compression`; the steps
mirror :mod:`hvdtrain.torch.compression` so both frameworks give the same update).

All state lives in ``tf.Variable`` so the exchange runs inside the adapter's ``tf.function``:
:meth:`CommExchange.apply_step` replaces the adapter's gradient allreduce for one update. A kernel
is viewed in PyTorch's logical layout, ``(out, in, k...)``, before it is flattened to a matrix.
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvdtrain.core.compression import CommPlan, comm_plan, compressible, effective_rank, \
    initial_q, matrix_shape, topk_count

EPSILON = 1e-8  # keeps Gram-Schmidt finite on an all-zero column


def logical_perm(ndim: int) -> list[int]:
    """The transpose taking a TF kernel ``(k..., in, out)`` to PyTorch's ``(out, in, k...)``."""
    return [ndim - 1, ndim - 2, *range(ndim - 2)] if ndim >= 2 else list(range(ndim))


def logical_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A TF variable's shape in PyTorch's layout."""
    return tuple(shape[i] for i in logical_perm(len(shape)))


def to_matrix(grad: Any) -> Any:
    """The ``(out, in * k...)`` matrix PowerSGD compresses."""
    shape = tuple(grad.shape)
    n, m = matrix_shape(logical_shape(shape))
    return tf.reshape(tf.transpose(grad, logical_perm(len(shape))), (n, m))


def from_matrix(matrix: Any, shape: tuple[int, ...]) -> Any:
    """Inverse of :func:`to_matrix`."""
    perm = logical_perm(len(shape))
    return tf.transpose(tf.reshape(matrix, logical_shape(shape)), np.argsort(perm).tolist())


def gram_schmidt(matrix: Any) -> Any:
    """Orthonormal columns: modified Gram-Schmidt run twice, the same arithmetic as
    :func:`hvdtrain.torch.compression.gram_schmidt`."""
    for _ in range(2):
        cols = [matrix[:, i:i + 1] for i in range(matrix.shape[1])]
        for i in range(len(cols)):
            cols[i] = cols[i] / (tf.norm(cols[i]) + EPSILON)
            for j in range(i + 1, len(cols)):
                cols[j] = cols[j] - cols[i] * tf.reduce_sum(cols[i] * cols[j])
        matrix = tf.concat(cols, axis=1)
    return matrix


def _world_size() -> Any:
    return tf.cast(hvd.size_op(), tf.float32)


class CommExchange:
    """The adapter's gradient exchange for one of PowerSGD, top-k and local SGD."""

    def __init__(self, plan: CommPlan, adapter: Any, shapes: list[tuple[int, ...]] | None = None) -> None:
        self.plan, self.adapter = plan, adapter
        self.compression = hvd.Compression.fp16 if plan.fp16_wire else hvd.Compression.none
        self.shapes = shapes if shapes is not None else [tuple(v.shape) for v in adapter.trainable]
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.errors: dict[int, tf.Variable] = {}
        self.qs: dict[int, tf.Variable] = {}
        if plan.method == "powersgd":
            self.packed = [i for i, s in enumerate(self.shapes) if compressible(logical_shape(s), plan)]
            for j, i in enumerate(self.packed):
                n, m = matrix_shape(logical_shape(self.shapes[i]))
                r = effective_rank(n, m, plan.powersgd_rank)
                self.qs[i] = tf.Variable(initial_q(j, m, r), trainable=False)
                self.errors[i] = tf.Variable(tf.zeros((n, m)), trainable=False)
        elif plan.method == "topk":
            for i, s in enumerate(self.shapes):
                self.errors[i] = tf.Variable(tf.zeros((int(np.prod(s, dtype=np.int64)),)), trainable=False)

    # ---- one update, inside the adapter's tf.function -------------------------------------------
    def apply_step(self, inputs: Any, targets: Any, weight: Any) -> Any:
        """Forward, backward, exchange and update (replaces the adapter's allreduce for this run)."""
        adapter = self.adapter
        from hvdtrain.tensorflow.adapter import tf_variables

        with tf.GradientTape() as tape:
            _, loss = adapter._loss(inputs, targets, training=True)
            scaled = adapter._scale_loss(loss, weight)
        variables = tf_variables(adapter.trainable)
        # an embedding's gradient is IndexedSlices, whose dense form has no static shape: give every
        # gradient its variable's, which PowerSGD's matrices and top-k's sizes are built from
        local = [tf.ensure_shape(tf.convert_to_tensor(g), v.shape) if g is not None else tf.zeros_like(v)
                 for g, v in zip(tape.gradient(scaled, variables), variables)]
        if adapter.accumulators:
            local = [a + g for a, g in zip(adapter.accumulators, local)]
            for a in adapter.accumulators:
                a.assign(tf.zeros_like(a))
        applied = adapter._update(self.reduce(local))
        if self.plan.method == "local_sgd":
            self.steps.assign_add(1)
            tf.cond(self.steps >= self.plan.local_sgd_steps, self._average_graph, lambda: tf.constant(0))
        return loss, applied

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The exchanged average of ``grads`` (local SGD: the local gradients themselves)."""
        if self.plan.method == "local_sgd":
            return grads
        self.steps.assign_add(1)
        if self.plan.method == "topk":
            return self._topk(grads)
        if self.plan.powersgd_start_step == 0:
            return self._powersgd(grads)
        return tf.cond(self.steps <= self.plan.powersgd_start_step,
                       lambda: hvd.grouped_allreduce(grads, op=hvd.Average,  # distributed: warm-up
                                                     compression=self.compression),
                       lambda: self._powersgd(grads))

    def _powersgd(self, grads: list[Any]) -> list[Any]:
        plain = [i for i in range(len(grads)) if i not in self.qs]
        matrices = {i: to_matrix(grads[i]) + self.errors[i] for i in self.packed}
        ps = [tf.matmul(matrices[i], gram_schmidt(tf.convert_to_tensor(self.qs[i]))) for i in self.packed]
        reduced = hvd.grouped_allreduce([grads[i] for i in plain] + ps, op=hvd.Average,  # distributed: P's
                                        compression=self.compression)
        out: list[Any] = [None] * len(grads)
        for i, tensor in zip(plain, reduced[:len(plain)]):
            out[i] = tensor
        ps = [gram_schmidt(tf.cast(p, tf.float32)) for p in reduced[len(plain):]]
        qs = [tf.matmul(matrices[i], p, transpose_a=True) for i, p in zip(self.packed, ps)]
        if qs:
            qs = hvd.grouped_allreduce(qs, op=hvd.Average, compression=self.compression)  # distributed: Q's
        for i, p, q in zip(self.packed, ps, qs):
            q = tf.cast(q, tf.float32)
            approx = tf.matmul(p, q, transpose_b=True)
            self.errors[i].assign(matrices[i] - approx)
            self.qs[i].assign(q)
            out[i] = from_matrix(approx, self.shapes[i])
        return out

    def _topk(self, grads: list[Any]) -> list[Any]:
        values, indices, offset = [], [], 0
        for i, g in enumerate(grads):
            flat = tf.reshape(g, [-1]) + self.errors[i]
            numel = int(flat.shape[0])
            k = topk_count(numel, self.plan.topk_ratio)
            index = tf.math.top_k(tf.abs(flat), k=k, sorted=False).indices
            value = tf.gather(flat, index)
            if self.plan.fp16_wire:
                value = tf.cast(value, tf.float16)
            self.errors[i].assign(tf.tensor_scatter_nd_sub(flat, index[:, None], tf.cast(value, tf.float32)))
            values.append(value)
            indices.append(index + offset)
            offset += numel
        all_values = hvd.allgather(tf.concat(values, 0), name="hvdtrain.topk.values")  # distributed
        all_indices = hvd.allgather(tf.concat(indices, 0), name="hvdtrain.topk.indices")  # distributed
        total = tf.scatter_nd(all_indices[:, None], tf.cast(all_values, tf.float32), [offset]) / _world_size()
        out, start = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(tf.reshape(total[start:start + size], shape))
            start += size
        return out

    # ---- local SGD ------------------------------------------------------------------------------
    def _averaged_variables(self) -> list[Any]:
        from hvdtrain.tensorflow.adapter import tf_variables

        variables = tf_variables(self.adapter.model.variables)
        if self.plan.local_sgd_average_optimizer:
            variables += tf_variables(self.adapter.optimizer.variables)
        return [v for v in variables if v.dtype.is_floating]

    def _average_graph(self) -> Any:
        variables = self._averaged_variables()
        averaged = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in variables],  # distributed
                                         op=hvd.Average)
        for v, mean in zip(variables, averaged):
            v.assign(mean)
        self.steps.assign(0)
        return tf.constant(0)

    def sync_replicas(self) -> None:
        """Local SGD: average the replicas now unless they were just averaged (eager)."""
        if self.plan.method == "local_sgd" and int(self.steps.numpy()) > 0:
            self._average_graph()

    # ---- checkpoint state -----------------------------------------------------------------------
    def comm_state(self) -> dict[str, np.ndarray]:
        """Counters, Q matrices, this rank's error buffers and (local SGD) its own replica."""
        state = {"steps": np.asarray(self.steps.numpy())}
        state.update({f"q/{i}": v.numpy() for i, v in self.qs.items()})
        state.update({f"error/{i}": v.numpy() for i, v in self.errors.items()})
        if self.plan.method == "local_sgd":
            if int(self.steps.numpy()) > 0:
                state.update({f"model/{i:05d}": np.asarray(v.numpy()) for i, v in
                              enumerate(self.adapter.model.variables)})
            if int(self.steps.numpy()) > 0 or not self.plan.local_sgd_average_optimizer:
                state.update({f"optimizer/{i:05d}": np.asarray(v.numpy()) for i, v in
                              enumerate(self.adapter.optimizer.variables)})
        return state

    def load_comm_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from what :meth:`comm_state` returned on this rank."""
        self.steps.assign(int(state["steps"]))
        for prefix, table in (("q/", self.qs), ("error/", self.errors)):
            for key, value in state.items():
                if key.startswith(prefix):
                    table[int(key[len(prefix):])].assign(value)
        for prefix, variables in (("model/", self.adapter.model.variables),
                                  ("optimizer/", self.adapter.optimizer.variables)):
            for key, value in state.items():
                if key.startswith(prefix):
                    variables[int(key[len(prefix):])].assign(value)

    def reset_comm_state(self) -> None:
        """Start afresh: zero error buffers and counters, seeded Q (a world-size change)."""
        self.steps.assign(0)
        for v in self.errors.values():
            v.assign(tf.zeros_like(v))
        for j, i in enumerate(sorted(self.qs)):
            self.qs[i].assign(initial_q(j, *self.qs[i].shape))


def comm_exchange(adapter: Any, config: Any) -> CommExchange | None:
    """The exchange the config asks for (PowerSGD, top-k, local SGD), or None for Horovod's allreduce."""
    plan = comm_plan(config)
    return None if plan is None else CommExchange(plan, adapter)
