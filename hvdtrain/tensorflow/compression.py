"""The gradient exchanges for TensorFlow on Horovod collectives (:mod:`hvdtrain.core.exchange`):
Horovod's allreduce, PowerSGD and top-k with error feedback, and local SGD (the algorithms are
described in :mod:`hvdtrain.core.compression`; the steps mirror :mod:`hvdtrain.torch.compression`
so both frameworks give the same update).

The adapter's ``tf.function`` step calls :meth:`reduce` on the tape's gradients and
:meth:`after_update` after its update, so all state lives in ``tf.Variable``. A kernel is viewed in
PyTorch's logical layout, ``(out, in, k...)``, before it is flattened to a matrix, and the
checkpoint state is kept in that layout too (the same keys and arrays as torch's).
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvdtrain.core.compression import CommPlan, compressible, effective_rank, initial_q, matrix_shape, topk_count
from hvdtrain.core.exchange import Stateless, indexed, replica_key, state_format

EPSILON = 1e-8  # keeps Gram-Schmidt finite on an all-zero column


def tf_variables(variables: list[Any]) -> list[tf.Variable]:
    """The ``tf.Variable`` behind each Keras 3 variable (what Horovod's TF ops accept)."""
    return [getattr(v, "value", v) if not isinstance(v, tf.Variable) else v for v in variables]


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


def _dense(grads: list[Any], shapes: list[tuple[int, ...]]) -> list[Any]:
    """Dense gradients with their variables' static shapes (an embedding's gradient is
    IndexedSlices, whose dense form has none; PowerSGD's matrices and top-k's sizes need them);
    zeros where a variable got no gradient."""
    return [tf.ensure_shape(tf.convert_to_tensor(g), s) if g is not None else tf.zeros(s)
            for g, s in zip(grads, shapes)]


class Allreduce(Stateless):
    """Horovod's allreduce (average or Adasum, optional float16 on the wire): the function
    ``hvd.DistributedGradientTape`` applies to the tape's gradients, with the same arguments, so
    the step's graph is the one the tape builds (each gradient's allreduce starts as soon as the
    gradient exists unless ``groups`` fuses them; skipped on a single worker)."""

    def __init__(self, variables: list[Any], compression: Any, op: Any, groups: int | None) -> None:
        self.variables = tf_variables(variables)
        # horovod.tensorflow's own builder of DistributedGradientTape's reduction (0.28: private)
        self._allreduce = hvd._make_allreduce_grads_fn(  # pylint: disable=protected-access
            "DistributedGradientTape", "", "", compression, True, op, 1.0, groups, hvd.global_process_set)

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The averaged (or Adasum-combined) gradients; IndexedSlices become dense."""
        return self._allreduce(grads, self.variables)  # distributed


class PowerSGD:
    """Rank-r PowerSGD with error feedback and warm-started Q for gradients of the given
    (TensorFlow) ``shapes``."""

    keeps_state = True
    buffers_agree = False  # the ranks' running statistics differ: sync_model_buffers averages them

    def __init__(self, plan: CommPlan, shapes: list[tuple[int, ...]]) -> None:
        self.plan, self.shapes = plan, [tuple(s) for s in shapes]
        self.compression = hvd.Compression.fp16 if plan.fp16_wire else hvd.Compression.none
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.errors: dict[int, tf.Variable] = {}
        self.qs: dict[int, tf.Variable] = {}
        self.packed = [i for i, s in enumerate(self.shapes) if compressible(logical_shape(s), plan)]
        for j, i in enumerate(self.packed):
            n, m = matrix_shape(logical_shape(self.shapes[i]))
            r = effective_rank(n, m, plan.powersgd_rank)
            self.qs[i] = tf.Variable(initial_q(j, m, r), trainable=False)
            self.errors[i] = tf.Variable(tf.zeros((n, m)), trainable=False)

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The averaged (and, after the warm-up, compressed) gradients, in the same order and shapes."""
        grads = _dense(grads, self.shapes)
        self.steps.assign_add(1)
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

    def after_update(self) -> None:
        """Nothing to do."""
        return None  # a body besides the docstring: AutoGraph cannot convert an empty one (a warning per rank)

    def sync_replicas(self) -> None:
        """The replicas are always equal."""

    def state(self) -> dict[str, np.ndarray]:
        """``steps``, ``q/<i>``, ``error/<i>`` (the ``n x m`` matrices): :mod:`hvdtrain.core.exchange`."""
        state = {"steps": np.asarray(self.steps.numpy())}
        state.update({f"q/{i}": v.numpy() for i, v in self.qs.items()})
        state.update({f"error/{i}": v.numpy() for i, v in self.errors.items()})
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Put back what :meth:`state` returned (formats 1 and 2 are the same here); what a state
        lacks (torch's buffers appear at the first compressed step) starts afresh."""
        self.reset()
        self.steps.assign(int(state["steps"]))
        for prefix, table in (("q/", self.qs), ("error/", self.errors)):
            for i, value in indexed(state, prefix).items():
                table[i].assign(value)

    def restart(self, accumulation: int) -> None:
        """An elastic sync: nothing counts the micro-batches here (they accumulate locally)."""
        return None  # a body besides the docstring, as in Stateless.after_update

    def reset(self) -> None:
        """Start afresh: zero error buffers and counter, seeded Q (a world-size change)."""
        self.steps.assign(0)
        for v in self.errors.values():
            v.assign(tf.zeros_like(v))
        for j, i in enumerate(self.packed):
            self.qs[i].assign(initial_q(j, *self.qs[i].shape))


class TopK:
    """Top-k sparsification with error feedback, exchanged with two allgathers (values, indices),
    for gradients of the given (TensorFlow) ``shapes``."""

    keeps_state = True
    buffers_agree = False  # the ranks' running statistics differ: sync_model_buffers averages them

    def __init__(self, plan: CommPlan, shapes: list[tuple[int, ...]]) -> None:
        self.plan, self.shapes = plan, [tuple(s) for s in shapes]
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        # flat, in the variable's own layout (the checkpoint state holds PyTorch's: see state())
        self.errors = {i: tf.Variable(tf.zeros((int(np.prod(s, dtype=np.int64)),)), trainable=False)
                       for i, s in enumerate(self.shapes)}

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The average over ranks of every rank's k largest-magnitude entries (error added)."""
        grads = _dense(grads, self.shapes)
        self.steps.assign_add(1)
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

    def after_update(self) -> None:
        """Nothing to do."""
        return None  # a body besides the docstring: AutoGraph cannot convert an empty one (a warning per rank)

    def sync_replicas(self) -> None:
        """The replicas are always equal."""

    def state(self) -> dict[str, np.ndarray]:
        """``steps`` and ``error/<i>``, flattened in PyTorch's logical layout."""
        state = {"steps": np.asarray(self.steps.numpy())}
        for i, v in self.errors.items():
            shape = self.shapes[i]
            state[f"error/{i}"] = v.numpy().reshape(shape).transpose(logical_perm(len(shape))).reshape(-1)
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Put back what :meth:`state` returned; format 1 kept each error in the variable's layout."""
        self.reset()
        self.steps.assign(int(state["steps"]))
        legacy = state_format(state) == 1
        for i, value in indexed(state, "error/").items():
            shape = self.shapes[i]
            self.errors[i].assign(value if legacy else value.reshape(logical_shape(shape)).transpose(
                np.argsort(logical_perm(len(shape)))).reshape(-1))

    def restart(self, accumulation: int) -> None:
        """An elastic sync: nothing counts the micro-batches here (they accumulate locally)."""
        return None  # a body besides the docstring, as in Stateless.after_update

    def reset(self) -> None:
        """Start afresh: zero error buffers and counter (a world-size change)."""
        self.steps.assign(0)
        for v in self.errors.values():
            v.assign(tf.zeros_like(v))


class LocalSGD:
    """Periodic averaging of the model (and optionally the optimizer state) in one grouped allreduce;
    each rank applies its own gradients in between."""

    keeps_state = True
    buffers_agree = False  # the ranks' running statistics differ: sync_model_buffers averages them

    def __init__(self, plan: CommPlan, model: Any, optimizer: Any) -> None:
        self.plan, self.model, self.optimizer = plan, model, optimizer
        self.since_average = tf.Variable(0, dtype=tf.int64, trainable=False)

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The local gradients themselves: nothing is sent."""
        return grads

    def after_update(self) -> None:
        """Count one local update; average when ``comm.local_sgd_steps`` have been taken (graph)."""
        self.since_average.assign_add(1)
        tf.cond(self.since_average >= self.plan.local_sgd_steps, self._average, lambda: tf.constant(0))

    def _averaged_variables(self) -> list[Any]:
        variables = tf_variables(self.model.variables)
        if self.plan.local_sgd_average_optimizer:
            variables += tf_variables(self.optimizer.variables)
        return [v for v in variables if v.dtype.is_floating]

    def _average(self) -> Any:
        variables = self._averaged_variables()
        averaged = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in variables],  # distributed
                                         op=hvd.Average)
        for v, mean in zip(variables, averaged):
            v.assign(mean)
        self.since_average.assign(0)
        return tf.constant(0)

    def sync_replicas(self) -> None:
        """Average the replicas now unless they were just averaged (eager)."""
        if int(self.since_average.numpy()) > 0:
            self._average()

    def state(self) -> dict[str, np.ndarray]:
        """The period's position and, between averagings, this rank's own model and optimizer
        variables (the optimizer's also right after an averaging that left it out)."""
        since = int(self.since_average.numpy())
        state = {"since_average": np.asarray(since, dtype=np.int64)}
        if since > 0:
            state.update({replica_key("model", i): np.asarray(v.numpy()) for i, v in enumerate(self.model.variables)})
        if since > 0 or not self.plan.local_sgd_average_optimizer:
            state.update({replica_key("optimizer", i): np.asarray(v.numpy())
                          for i, v in enumerate(self.optimizer.variables)})
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Put back what :meth:`state` returned; format 1 kept the counter under ``steps``."""
        self.since_average.assign(int(state["steps"] if state_format(state) == 1 else state["since_average"]))
        for kind, variables in (("model", self.model.variables), ("optimizer", self.optimizer.variables)):
            for i, value in indexed(state, f"{kind}/").items():
                variables[i].assign(value)

    def restart(self, accumulation: int) -> None:
        """An elastic sync: nothing counts the micro-batches here (they accumulate locally)."""
        return None  # a body besides the docstring, as in Stateless.after_update

    def reset(self) -> None:
        """Start a new averaging period (the replicas are equal: just broadcast or averaged)."""
        self.since_average.assign(0)


def build_exchange(plan: CommPlan, variables: list[Any], model: Any, optimizer: Any) -> Any:
    """hvdtrain's own exchange for ``plan`` (from :func:`hvdtrain.core.compression.comm_plan`);
    Horovod's is :class:`Allreduce`. ``variables``: the trainable variables whose gradients it
    exchanges; ``optimizer``: the one whose variables local SGD keeps per rank."""
    shapes = [tuple(v.shape) for v in variables]
    if plan.method == "powersgd":
        return PowerSGD(plan, shapes)
    if plan.method == "topk":
        return TopK(plan, shapes)
    return LocalSGD(plan, model, optimizer)
