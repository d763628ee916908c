"""Pipeline parallelism for TensorFlow / Keras 3: :class:`TensorFlowPipelineAdapter`.

The same design as :mod:`hvdtrain.torch.pipeline`: the recipe's ``TrainTask.pipeline_blocks()``
lists the model as ordered Keras sub-models that share the model's layers (see
:func:`functional_blocks`); the blocks are cut into S stages; one ``train_step`` runs the GPipe
schedule, each micro-batch's forward inside a ``tf.GradientTape`` kept until its backward tick,
activations and their gradients exchanged by ``hvd.alltoall`` on the replica's process set; each
stage averages its gradients over its replicas (one grouped allreduce on the stage's process set),
the global norm is summed over the stages, and each stage clips and applies its own gradients.

Keras layers own their variables, so every rank still holds the whole model's weights (not their
gradients or optimizer slots: those exist for its stage only). Checkpoints keep the non-pipelined
format: rank 0 gathers every stage's variables and optimizer slots and writes the model's
variables and an optimizer file in the order a non-pipelined run uses; its own copy of the other
stages' weights is refreshed from them, so the recipe's export after training saves the trained model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain.core import pipeline
from hvdtrain.core.adapter import DistContext, NonFiniteGradientError
from hvdtrain.core.rules import fp16_allreduce
from hvdtrain.tensorflow.adapter import (MODEL_FILE, OPTIMIZER_FILE, TensorFlowAdapter, _as_tensor, _load_variables,
                                         _save_variables, offset_seed_states, tf_variables)


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


def _slice(inputs: Any, start: int, stop: int) -> Any:
    if isinstance(inputs, dict):
        return {k: v[start:stop] for k, v in inputs.items()}
    return inputs[start:stop]


class TensorFlowPipelineAdapter(TensorFlowAdapter):
    """The model cut into stages across the ranks of each replica, replicas data-parallel."""

    def init(self, config: Any) -> DistContext:
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"  # process sets are added after hvd.init()
        super().init(config)
        self.layout = pipeline.Layout.for_world(hvd.size(), config.parallel.pipeline_stages)
        rank = hvd.rank()
        self.stage, self.replica = self.layout.stage_of(rank), self.layout.replica_of(rank)
        self.stage_set, self.replica_set = self.layout.open_process_sets(hvd, rank)  # None: a single replica
        self.ctx = DistContext(rank, hvd.size(), hvd.local_rank(), hvd.local_size(),
                               replica=self.replica, replicas=self.layout.replicas, mpi=hvd.mpi_enabled(),
                               gpu=bool(tf.config.list_logical_devices("GPU")))
        return self.ctx

    def context(self) -> DistContext:
        return self.ctx

    def prepare(self, task: Any, config: Any) -> None:
        stages = self.layout.stages
        self.task, self.model, self.optimizer = task, task.model, task.optimizer
        if not self.model.built:
            sample, _ = task.train_data.get_batch(np.arange(1), 0)
            self.model(_as_tensor(sample), training=False)
        blocks = pipeline.model_blocks(task, config)
        costs = [sum(int(np.prod(v.shape)) for v in b.trainable_variables) for b in blocks]
        self.bounds = pipeline.resolve_cut(config.parallel.cut, costs, stages)
        owner = pipeline.tensor_owners(self.bounds, blocks, stages, lambda block: block.variables)
        self.variable_stage = [owner.get(id(v), 0) for v in self.model.variables]  # un-owned: stage 0
        self.own_variables = [v for v, s in zip(self.model.variables, self.variable_stage) if s == self.stage]
        self.trainable = [v for v in self.model.trainable_variables if owner.get(id(v), 0) == self.stage]
        self.optimizer.build(self.trainable)  # slots for this stage only
        self.blocks = [blocks[b] for b in pipeline.stage_blocks(self.bounds, len(blocks), self.stage)]
        self.micro_batches = config.parallel.micro_batches
        self.grad_clip_norm = config.optim.grad_clip_norm
        self.nonfinite = config.train.nonfinite
        self.compression = hvd.Compression.fp16 if fp16_allreduce(config) else hvd.Compression.none
        self.accumulation, self.overlap = 1, False
        self.first, self.last = self.stage == 0, self.stage == stages - 1
        self._pending: dict[str, Any] | None = None
        self._gathered: list[dict[str, Any]] | None = None
        self._metric_keys: list[str] | None = None
        # this stage's forward as one graph; the tape around each call records it as one op, whose
        # gradient is the compiled backward (eager Keras layers cost far more than their arithmetic)
        self._stage_forward = tf.function(self._run_blocks, reduce_retracing=True)
        self._stage_loss = tf.function(self._forward_and_loss, reduce_retracing=True)

    def _run_blocks(self, x: Any, inputs: Any, training: bool) -> Any:
        for block in self.blocks:
            x = block([x, inputs], training=training) if getattr(block, "needs_inputs", False) \
                else block(x, training=training)
        return x

    def _forward_and_loss(self, x: Any, inputs: Any, targets: Any) -> tf.Tensor:
        """The last stage in training: its blocks, then the task's loss (float32)."""
        return tf.cast(self.task.loss_fn(self._run_blocks(x, inputs, True), targets), tf.float32)

    def _exchange(self, payload: tf.Tensor | None, to_stage: int | None, name: str) -> tf.Tensor | None:
        send = payload if payload is not None else tf.zeros([0], tf.float32)
        splits = [0] * self.layout.stages
        if to_stage is not None:
            splits[to_stage] = int(send.shape[0])
        received, _ = hvd.alltoall(send, splits=tf.constant(splits, tf.int32), name=name,
                                   process_set=self.replica_set)  # distributed
        return received if int(received.shape[0]) else None

    def _forward_ticks(self, inputs: Any, targets: Any, sizes: list[int], training: bool) -> dict[int, Any]:
        s, stages = self.stage, self.layout.stages
        n = sum(sizes)
        offsets = [sum(sizes[:m]) for m in range(len(sizes))]
        received: dict[int, tf.Tensor] = {}
        results: dict[int, Any] = {}
        for t, row in enumerate(pipeline.forward_ticks(stages, len(sizes))):
            m, payload = row[s], None
            if m is not None:
                mb_inputs = _slice(inputs, offsets[m], offsets[m] + sizes[m])
                x = mb_inputs if self.first else received.pop(m)
                tape = tf.GradientTape() if training else None
                if tape is not None:
                    with tape:
                        if not self.first:
                            tape.watch(x)
                        if self.last:
                            loss = self._stage_loss(x, mb_inputs, targets[offsets[m]:offsets[m] + sizes[m]])
                            y = (loss, loss * (sizes[m] / n))
                        else:
                            y = self._stage_forward(x, mb_inputs, True)
                else:
                    y = self._stage_forward(x, mb_inputs, False)
                results[m] = (tape, x, y)
                if not self.last:
                    payload = pack(y)
            if any(row[k] is not None for k in range(stages - 1)):
                got = self._exchange(payload, s + 1 if payload is not None else None, f"hvdtrain.pipe.fwd.{t}")
                if not self.first and row[s - 1] is not None:
                    received[row[s - 1]] = unpack(got)
        return results

    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True,
                   weight: float | None = None) -> float:  # weight: always the whole batch (no accumulation)
        inputs, targets = _as_tensor(inputs), tf.convert_to_tensor(targets)
        n, s, stages = int(targets.shape[0]), self.stage, self.layout.stages
        sizes = pipeline.split_sizes(n, self.micro_batches)
        results = self._forward_ticks(inputs, targets, sizes, training=True)
        variables = tf_variables(self.trainable)
        summed = [tf.zeros_like(v) for v in variables]
        loss_sum = 0.0
        grads_in: dict[int, tf.Tensor] = {}
        for t, row in enumerate(pipeline.backward_ticks(stages, len(sizes))):
            m, payload = row[s], None
            if m is not None:
                tape, x, y = results.pop(m)
                sources = variables + ([] if self.first else [x])
                if self.last:
                    loss_sum += float(y[0]) * sizes[m]
                    grads = tape.gradient(y[1], sources)
                else:
                    grads = tape.gradient(y, sources, output_gradients=tf.cast(grads_in.pop(m), y.dtype))
                summed = [a if g is None else a + tf.convert_to_tensor(g)
                          for a, g in zip(summed, grads[:len(variables)])]
                if not self.first:
                    payload = pack(grads[-1])
            if any(row[k] is not None for k in range(1, stages)):
                got = self._exchange(payload, s - 1 if payload is not None else None, f"hvdtrain.pipe.bwd.{t}")
                if not self.last and row[s + 1] is not None:
                    grads_in[row[s + 1]] = unpack(got)
        return self._update_stage(summed, loss_sum / n)

    def _update_stage(self, grads: list[tf.Tensor], loss: float) -> float:
        if self.stage_set is not None and grads:
            grads = hvd.grouped_allreduce(grads, op=hvd.Average, compression=self.compression,
                                          process_set=self.stage_set)  # distributed: this stage's replicas
        local = float(tf.linalg.global_norm(grads)) if grads else 0.0
        totals = hvd.allreduce(tf.constant([local ** 2, loss if self.last else 0.0], tf.float64), op=hvd.Sum,
                               name="hvdtrain.pipe.norm", process_set=self.replica_set)  # distributed
        norm, loss = float(totals[0]) ** 0.5, float(totals[1])
        if not np.isfinite(norm):
            if self.nonfinite == "error":
                raise NonFiniteGradientError(f"the allreduced gradient is not finite (norm {norm})")
            self.skipped_updates += 1
            return loss
        if self.grad_clip_norm is not None and grads:
            grads, _ = tf.clip_by_global_norm(grads, self.grad_clip_norm, use_norm=tf.constant(norm, tf.float32))
        if grads:
            self.optimizer.apply_gradients(zip(grads, self.trainable))
        return loss

    def eval_step(self, inputs: Any, targets: Any) -> dict[str, float]:
        inputs, targets = _as_tensor(inputs), tf.convert_to_tensor(targets)
        results = self._forward_ticks(inputs, targets, [int(targets.shape[0])], training=False)
        sums: dict[str, float] = {}
        if self.last:
            outputs = results[0][2]
            loss = float(tf.cast(self.task.loss_fn(outputs, targets), tf.float32))
            count = int(targets.shape[0])
            sums = {"loss_sum": loss * count, "count": float(count)}
            sums.update({k: float(v) for k, v in self.task.metric_sums(outputs, targets).items()})
        if self._metric_keys is None:
            root = self.layout.rank_of(self.layout.stages - 1, self.replica)
            self._metric_keys = hvd.broadcast_object(sorted(sums), root_rank=root, name="hvdtrain.pipe.keys",
                                                     process_set=self.replica_set)  # distributed
        return {k: sums[k] for k in self._metric_keys} if self.last else {k: 0.0 for k in self._metric_keys}

    # -- state ----------------------------------------------------------------------------------

    def _slot_values(self) -> dict[str, np.ndarray]:
        """This stage's optimizer variables by path (the step counter and LR included)."""
        return {v.path: np.asarray(v.numpy()) for v in self.optimizer.variables}

    def broadcast_state(self, root_rank: int = 0) -> None:
        pending = hvd.broadcast_object(self._pending, root_rank=root_rank, name="hvdtrain.pipe.restore")  # distributed
        self._pending = None
        if pending is not None:
            for v, s, value in zip(self.model.variables, self.variable_stage, pending["model"]):
                if s == self.stage:
                    v.assign(value)
            for v in self.optimizer.variables:
                if v.path in pending["optimizer"]:
                    v.assign(pending["optimizer"][v.path])
        if self.stage_set is None:
            return
        root = self.layout.rank_of(self.stage, 0)
        hvd.broadcast_variables(tf_variables(self.own_variables) + tf_variables(self.optimizer.variables),
                                root_rank=root, process_set=self.stage_set)  # distributed: replicas start equal
        own = {id(v) for v in self.own_variables}  # ... but each replica draws its own dropout masks
        offset_seed_states([v for v in self._seed_states() if id(v) in own], self.replica)

    def sync_model_buffers(self) -> None:
        """BatchNorm statistics of this stage's own layers, averaged over the stage's replicas only."""
        floats = ("float16", "bfloat16", "float32", "float64")
        stats = [v for v, s in zip(self.model.variables, self.variable_stage)
                 if s == self.stage and not v.trainable and v.dtype in floats]
        if not stats or self.stage_set is None:
            return
        averaged = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in stats], op=hvd.Average,
                                         name=f"hvdtrain.pipe.buffers.{self.stage}",
                                         process_set=self.stage_set)  # distributed: this stage's replicas
        for variable, value in zip(stats, averaged):
            variable.assign(value)

    def gather_state(self) -> None:
        if self.replica == 0:
            self._gather_replica_zero()
        # distributed: nobody leaves (a rank that exits shuts Horovod down) before rank 0 holds everything
        hvd.allreduce(tf.zeros([1]), name="hvdtrain.pipe.gathered")

    def _gather_replica_zero(self) -> None:
        mine = {"model": {i: np.asarray(v.numpy()) for i, (v, s) in
                          enumerate(zip(self.model.variables, self.variable_stage)) if s == self.stage},
                "optimizer": self._slot_values()}
        gathered = [mine]
        for s in range(1, self.layout.stages):  # distributed: stage s of replica 0 -> rank 0
            got = hvd.broadcast_object(mine if s == self.stage else None, root_rank=self.layout.rank_of(s, 0),
                                       name=f"hvdtrain.pipe.gather.{s}", process_set=self.replica_set)
            if self.ctx.is_main:
                gathered.append(got)
        self._gathered = gathered if self.ctx.is_main else None

    def state_is_finite(self) -> bool:
        parts = self._gathered or []
        return all(np.isfinite(a).all() for part in parts for a in part["model"].values()
                   if np.issubdtype(a.dtype, np.floating))

    def _full_optimizer(self) -> keras.optimizers.Optimizer:
        """An optimizer like this one built on the whole model: the variable order of a non-pipelined run."""
        full = self.optimizer.__class__.from_config(self.optimizer.get_config())
        full.build(self.model.trainable_variables)
        return full

    def save_state(self, directory: Path) -> None:
        if self._gathered is None:
            raise RuntimeError("save_state on a pipeline stage without gather_state() first")
        values: dict[int, np.ndarray] = {}
        slots: dict[str, np.ndarray] = {}
        for part in self._gathered:
            values.update(part["model"])
            slots.update(part["optimizer"])
        model_vars = [_Saved(v, values[i]) for i, v in enumerate(self.model.variables)]
        for i, (variable, stage) in enumerate(zip(self.model.variables, self.variable_stage)):
            if stage != self.stage:  # rank 0's copy of the other stages, unused in its training: now whole,
                variable.assign(values[i])  # so the recipe's export (rank 0, after training) saves trained weights
        full = self._full_optimizer()
        missing = [v.path for v in full.variables if v.path not in slots]
        if missing:
            raise RuntimeError(f"pipeline checkpoint: no stage holds optimizer variables {missing[:3]}")
        _save_variables(Path(directory) / MODEL_FILE, model_vars)
        _save_variables(Path(directory) / OPTIMIZER_FILE, [_Saved(v, slots[v.path]) for v in full.variables])
        self._gathered = None

    def load_state(self, directory: Path) -> None:
        full = self._full_optimizer()
        _load_variables(Path(directory) / OPTIMIZER_FILE, full.variables)  # checks count and shapes
        with np.load(Path(directory) / MODEL_FILE, allow_pickle=False) as saved:
            names = sorted(n for n in saved.files if n != "paths")
            if len(names) != len(self.model.variables):
                raise ValueError(f"{directory / MODEL_FILE} holds {len(names)} variables, this model has "
                                 f"{len(self.model.variables)}")
            model = [saved[n] for n in names]
        self._pending = {"model": model, "optimizer": {v.path: np.asarray(v.numpy()) for v in full.variables}}

    def snapshot(self) -> Any:
        raise NotImplementedError("pipeline stages do not support elastic mode")

    def restore_snapshot(self, snapshot: Any) -> None:
        raise NotImplementedError("pipeline stages do not support elastic mode")

    def elastic_reset(self) -> None:
        raise NotImplementedError("pipeline stages do not support elastic mode")


class _Saved:
    """A value with a variable's path, in the shape :func:`_save_variables` reads."""

    def __init__(self, variable: Any, value: np.ndarray):
        self.path = self.name = getattr(variable, "path", None) or variable.name
        self.value = value

    def numpy(self) -> np.ndarray:
        return self.value
