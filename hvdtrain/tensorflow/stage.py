"""One pipeline stage in TensorFlow / Keras 3: the primitives :class:`hvdtrain.core.gpipe.GPipe` drives.

The schedule, the update's reductions and the movement of state are in :mod:`hvdtrain.core.gpipe`;
here are only what needs TensorFlow or ``horovod.tensorflow``. The recipe's
``TrainTask.pipeline_blocks()`` lists the model as ordered Keras sub-models that share the model's
layers (see :func:`functional_blocks`). Each micro-batch's forward runs inside a
``tf.GradientTape`` kept until its backward tick; the stage's forward is one ``tf.function``, which
the tape records as one op whose gradient is the compiled backward (eager Keras layers cost far
more than their arithmetic).

Keras layers own their variables, so every rank still holds the whole model's weights (not their
gradients or optimizer slots: those exist for its stage only). Checkpoints keep the un-cut format
(the model's variables and an optimizer file in the order a non-pipelined run uses); rank 0's copy
of the other stages' weights is refreshed when it writes one, so the recipe's export after
training saves the trained model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain.core.collectives import broadcast_pickled
from hvdtrain.core.gpipe import Cut, Placement
from hvdtrain.core.exchange_plan import Workers, plan_exchange
from hvdtrain.tensorflow.adapter import _as_tensor, _host_tensor, offset_seed_states
from hvdtrain.tensorflow.checkpoint import MODEL_FILE, OPTIMIZER_FILE, load_variables, read_variables, save_variables
from hvdtrain.tensorflow.compression import tf_variables

FLOATS = ("float16", "bfloat16", "float32", "float64")


def functional_blocks(model: keras.Model, boundaries: list[Any]) -> list[keras.Model]:
    """``model`` (functional or Sequential, built) cut at the outputs of the ``boundaries`` layers
    into consecutive sub-models sharing its layers; every path from the input to the output must
    pass through each boundary (true after a residual block's final activation)."""
    tensors = [model.inputs if len(model.inputs) > 1 else model.inputs[0]]
    tensors += [layer.output for layer in boundaries]
    tensors.append(model.outputs[0])
    return [keras.Model(a, b, name=f"{model.name}_block{i}") for i, (a, b) in enumerate(zip(tensors, tensors[1:]))]


def pack(tensor: Any) -> tf.Tensor:
    """A tensor as one flat float32 vector ``[ndim, *shape, *values]``."""
    tensor = tf.convert_to_tensor(tensor)
    header = tf.constant([len(tensor.shape), *tensor.shape], dtype=tf.float32)
    return tf.concat([header, tf.reshape(tf.cast(tensor, tf.float32), [-1])], axis=0)


def unpack(payload: tf.Tensor) -> tf.Tensor:
    """The tensor :func:`pack` encoded."""
    ndim = int(payload[0])
    shape = [int(d) for d in payload[1:1 + ndim].numpy()]
    return tf.reshape(payload[1 + ndim:], shape)


class _Saved:
    """A value with a variable's path, in the shape :func:`~hvdtrain.tensorflow.checkpoint.save_variables` reads."""

    def __init__(self, variable: Any, value: np.ndarray):
        self.path = self.name = getattr(variable, "path", None) or variable.name
        self.value = value

    def numpy(self) -> np.ndarray:
        """The value."""
        return self.value


class TensorFlowStage:
    """This rank's stage of the recipe's Keras model (see :class:`hvdtrain.core.gpipe.Stage` for the
    primitives). ``host``: the TensorFlow adapter, whose skip counter it uses."""

    def __init__(self, host: Any, task: Any, config: Any, placement: Placement):
        self.host, self.task, self.placement = host, task, placement
        self.model, self.optimizer = model, optimizer = task.model, task.optimizer
        stage = placement.stage
        if not model.built:
            sample, _ = task.train_data.get_batch(np.arange(1), 0)
            model(_as_tensor(sample), training=False)
        cut = Cut.of(task, config, stage, lambda block: sum(int(np.prod(v.shape)) for v in block.trainable_variables),
                     lambda block: block.variables)
        self.bounds = cut.bounds
        self.variable_stage = [cut.stage_of(v) for v in model.variables]  # un-owned: stage 0
        self.own_variables = [v for v, s in zip(model.variables, self.variable_stage) if s == stage]
        self.trainable = [v for v in model.trainable_variables if cut.stage_of(v) == stage]
        optimizer.build(self.trainable)  # slots for this stage only
        self.blocks = cut.own
        self.compression = hvd.Compression.fp16 if plan_exchange(config, Workers()).fp16_wire else hvd.Compression.none
        self._variables: list[tf.Variable] = []
        self._summed: list[tf.Tensor] = []
        self._stage_forward = tf.function(self.run_blocks, reduce_retracing=True)
        self._stage_loss = tf.function(self._forward_and_loss, reduce_retracing=True)

    # -- compute ----------------------------------------------------------------------------------

    def run_blocks(self, x: Any, inputs: Any, training: bool) -> Any:
        """This stage's blocks on ``x`` (``inputs``: the micro-batch's inputs, for blocks with
        ``needs_inputs``)."""
        for block in self.blocks:
            x = block([x, inputs], training=training) if getattr(block, "needs_inputs", False) \
                else block(x, training=training)
        return x

    def _forward_and_loss(self, x: Any, inputs: Any, targets: Any) -> tf.Tensor:
        """The last stage in training: its blocks, then the task's loss (float32)."""
        return tf.cast(self.task.loss_fn(self.run_blocks(x, inputs, True), targets), tf.float32)

    def seed_states(self) -> list[Any]:
        """The random-seed states (Keras Dropout and friends: int ``[seed, counter]``) of this stage's layers."""
        return [v for v in self.own_variables if "seed_generator_state" in getattr(v, "path", v.name)]

    def begin(self, inputs: Any, targets: Any, training: bool) -> tuple[Any, tf.Tensor, int]:
        """The batch as tensors; in training, this step's gradient sums start at zero."""
        inputs, targets = _as_tensor(inputs), tf.convert_to_tensor(targets)
        if training:
            self._variables = tf_variables(self.trainable)
            self._summed = [tf.zeros_like(v) for v in self._variables]
        return inputs, targets, int(targets.shape[0])

    def forward(self, x: Any, inputs: Any, targets: Any, weight: float, training: bool) -> tuple[Any, Any]:
        """The blocks on ``x``, in training under a tape (the last stage: with its loss, ``y`` is
        ``(loss, loss * weight)``)."""
        if not training:
            return None, self._stage_forward(x, inputs, False)
        with tf.GradientTape() as tape:
            if not self.placement.first:
                tape.watch(x)
            if self.placement.last:
                loss = self._stage_loss(x, inputs, targets)
                y = (loss, loss * weight)
            else:
                y = self._stage_forward(x, inputs, True)
        return (tape, x), y

    def backward(self, saved: Any, y: Any, grad: tf.Tensor | None) -> tuple[float | None, Any]:
        """Gradients of one micro-batch added to this step's sums; the input's gradient."""
        tape, x = saved
        sources = self._variables + ([] if self.placement.first else [x])
        loss = None
        if grad is None:  # the last stage: from its weighted loss
            loss = float(y[0])
            grads = tape.gradient(y[1], sources)
        else:
            grads = tape.gradient(y, sources, output_gradients=tf.cast(grad, y.dtype))
        self._summed = [a if g is None else a + tf.convert_to_tensor(g)
                        for a, g in zip(self._summed, grads[:len(self._variables)])]
        return loss, None if self.placement.first else grads[-1]

    def eval_sums(self, outputs: Any, targets: tf.Tensor) -> tuple[float, dict[str, float]]:
        """The mean loss and the task's metric sums on the model's ``outputs``."""
        loss = float(tf.cast(self.task.loss_fn(outputs, targets), tf.float32))
        return loss, {k: float(v) for k, v in self.task.metric_sums(outputs, targets).items()}

    def pack(self, tensor: Any) -> tf.Tensor:
        """See :func:`pack`."""
        return pack(tensor)

    def unpack(self, payload: tf.Tensor, requires_grad: bool) -> tf.Tensor:
        """See :func:`unpack` (the tape watches received activations)."""
        return unpack(payload)

    # -- the update -------------------------------------------------------------------------------

    def gradients(self) -> list[tf.Tensor]:
        """This step's summed gradients of the stage's trainable variables."""
        return self._summed

    def norm(self, tensors: list[tf.Tensor]) -> float:
        """The L2 norm of all ``tensors`` together."""
        return float(tf.linalg.global_norm(tensors))

    def apply(self, grads: list[tf.Tensor], clip_norm: float | None, norm: float) -> None:
        """``grads`` clipped by the global norm, applied by the stage's optimizer."""
        if clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, clip_norm, use_norm=tf.constant(norm, tf.float32))
        if grads:
            self.optimizer.apply_gradients(zip(grads, self.trainable))

    def discard_gradients(self) -> None:
        """Nothing to clear: the sums start afresh with the next step."""

    def count_skipped_update(self) -> None:
        """One more skipped update on the adapter."""
        self.host.skipped_updates += 1

    # -- collectives ------------------------------------------------------------------------------

    def alltoall(self, payload: tf.Tensor | None, to_stage: int | None, name: str) -> tf.Tensor | None:
        """One tick's transfer inside the replica (``hvd.alltoall`` on its set)."""
        send = payload if payload is not None else tf.zeros([0], tf.float32)
        splits = [0] * self.placement.layout.stages
        if to_stage is not None:
            splits[to_stage] = int(send.shape[0])
        received, _ = hvd.alltoall(send, splits=tf.constant(splits, tf.int32), name=name,
                                   process_set=self.placement.replica_set)  # distributed
        return received if int(received.shape[0]) else None

    def stage_average(self, tensors: list[Any], name: str, compress: bool) -> list[tf.Tensor]:
        """``tensors`` averaged over the stage's replicas (one grouped allreduce)."""
        return hvd.grouped_allreduce([tf.convert_to_tensor(t) for t in tensors], op=hvd.Average, name=name,
                                     compression=self.compression if compress else hvd.Compression.none,
                                     process_set=self.placement.stage_set)  # distributed: the stage's set

    def allreduce_sum(self, values: list[float], name: str, process_set: Any) -> list[float]:
        """``values`` summed over ``process_set`` in float64."""
        summed = hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name=name,
                               process_set=process_set)  # distributed
        return [float(v) for v in summed.numpy()]

    def broadcast_object(self, obj: Any, root_rank: int, name: str, process_set: Any) -> Any:
        """``obj`` from ``root_rank`` over ``process_set``."""
        return broadcast_pickled(hvd, _host_tensor, obj, root_rank, name, process_set)  # distributed

    # -- state of the own blocks ------------------------------------------------------------------

    def own_state(self) -> dict[str, Any]:
        """This stage's variables (by their index in the model) and the optimizer's (by path)."""
        return {"model": {i: np.asarray(v.numpy()) for i, (v, s) in
                          enumerate(zip(self.model.variables, self.variable_stage)) if s == self.placement.stage},
                "optimizer": {v.path: np.asarray(v.numpy()) for v in self.optimizer.variables}, "groups": None}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """This stage's variables and optimizer variables out of a whole-model state."""
        for i, (v, s) in enumerate(zip(self.model.variables, self.variable_stage)):
            if s == self.placement.stage:
                v.assign(state["model"][i])
        for v in self.optimizer.variables:
            if v.path in state["optimizer"]:
                v.assign(state["optimizer"][v.path])

    def broadcast_own_state(self, root_rank: int) -> None:
        """Variables and optimizer variables from ``root_rank`` to the stage's other replicas; then
        each replica offsets its layers' seed states, so it draws its own dropout masks."""
        hvd.broadcast_variables(tf_variables(self.own_variables) + tf_variables(self.optimizer.variables),
                                root_rank=root_rank, process_set=self.placement.stage_set)  # distributed
        offset_seed_states(self.seed_states(), self.placement.replica)

    def statistics(self) -> list[Any]:
        """The floating-point non-trainable variables (BatchNorm statistics) of this stage's layers."""
        return [v for v in self.own_variables if not v.trainable and v.dtype in FLOATS]

    def assign(self, tensors: list[Any], values: list[Any]) -> None:
        """``values`` assigned to the variables ``tensors``."""
        for variable, value in zip(tensors, values):
            variable.assign(value)

    def all_finite(self, values: Sequence[np.ndarray]) -> bool:
        """True if every floating-point array in ``values`` is finite."""
        return all(np.isfinite(a).all() for a in values if np.issubdtype(a.dtype, np.floating))

    def _full_optimizer(self) -> keras.optimizers.Optimizer:
        """An optimizer like this one built on the whole model: the variable order of a non-pipelined run."""
        full = self.optimizer.__class__.from_config(self.optimizer.get_config())
        full.build(self.model.trainable_variables)
        return full

    def read_checkpoint(self, directory: Path) -> dict[str, Any]:
        """The model's and the un-cut optimizer's variables as a whole-model state."""
        full = self._full_optimizer()
        load_variables(directory / OPTIMIZER_FILE, full.variables)  # checks count and shapes
        # count, paths (not silently permuted) and shapes checked from the headers before any array is read
        model = dict(enumerate(read_variables(directory / MODEL_FILE, self.model.variables)))
        return {"model": model, "optimizer": {v.path: np.asarray(v.numpy()) for v in full.variables}, "groups": None}

    def write_checkpoint(self, directory: Path, state: dict[str, Any]) -> None:
        """The model's variables and the un-cut optimizer's, in a non-pipelined run's order."""
        values, slots = state["model"], state["optimizer"]
        model_vars = [_Saved(v, values[i]) for i, v in enumerate(self.model.variables)]
        for i, (variable, stage) in enumerate(zip(self.model.variables, self.variable_stage)):
            if stage != self.placement.stage:  # rank 0's copy of the other stages, unused in its training:
                variable.assign(values[i])  # now whole, so the recipe's export after training saves trained weights
        full = self._full_optimizer()
        missing = [v.path for v in full.variables if v.path not in slots]
        if missing:
            raise RuntimeError(f"pipeline checkpoint: no stage holds optimizer variables {missing[:3]}")
        save_variables(directory / MODEL_FILE, model_vars)
        save_variables(directory / OPTIMIZER_FILE, [_Saved(v, slots[v.path]) for v in full.variables])
