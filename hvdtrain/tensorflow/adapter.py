"""The :class:`~hvdtrain.core.adapter.FrameworkAdapter` for TensorFlow 2 / Keras 3 and ``horovod.tensorflow``.

Horovod 0.28.1's TF helpers predate Keras 3: they expect ``tf.Variable`` where Keras 3 has
``keras.Variable`` wrappers, and ``horovod.tensorflow.keras`` silently skips the allreduce with
Keras 3 optimizers. This adapter therefore drives training with ``tf.GradientTape`` in a ``tf.function``
whose gradients go through the run's gradient exchange (:mod:`hvdtrain.core.exchange`; by default
the reduction ``hvd.DistributedGradientTape`` applies) and hands Horovod the wrapped
``tf.Variable`` (``v.value``) of every Keras variable.

With ``train.mixed_precision=fp16`` the optimizer is wrapped in Keras's ``LossScaleOptimizer``:
the loss is scaled before the gradient, the allreduced gradient unscaled before clipping, an
overflowing update is skipped (and counted) and the scale lowered; the scale is an optimizer
variable, so it is broadcast and checkpointed with the rest of the optimizer state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain.core import finetune, reproducible
from hvdtrain.core.optimizer_policy import FROM_CONFIG, OptimizerFacts
from hvdtrain.core.adapter import DistContext, FrameworkAdapter, NonFiniteGradientError, NonFiniteStateError
from hvdtrain.core.collectives import Collectives
from hvdtrain.core.compiled import FirstStepClock
from hvdtrain.core.config import ConfigError
from hvdtrain.core.errors import type_name
from hvdtrain.core.exchange_plan import ExchangePlan, Workers, plan_exchange
from hvdtrain.core.gpipe import GPipe, pipelined
from hvdtrain import launch
from hvdtrain.tensorflow import compiled, exchanges
from hvdtrain.tensorflow import reproducible as bitwise
from hvdtrain.tensorflow.checkpoint import MODEL_FILE, OPTIMIZER_FILE, load_variables, save_variables
from hvdtrain.tensorflow.compression import tf_variables
from hvdtrain.tensorflow.exchanges import WholeState
from hvdtrain.tensorflow.finetune import BackboneControl, head_variables

SEED_STRIDE = 1_000_003  # rank r's layer seeds are rank 0's plus r times this


def offset_seed_states(states: list[Any], index: int) -> None:
    """Shift Keras layer seed states (``[seed, counter]``, broadcast from data-parallel copy 0) by
    ``index`` strides, so that copy ``index`` draws its own dropout masks; copy 0 keeps its own
    stream, so its checkpoint restores every copy's stream."""
    for state in states:
        state.assign(state.value + tf.constant([SEED_STRIDE * index, 0], dtype=state.dtype))


def _host_tensor(array: np.ndarray) -> Any:
    """A NumPy array as a tensor in host memory (the checkpoint's per-rank state travels on the CPU)."""
    with tf.device("/cpu:0"):
        return tf.convert_to_tensor(array)


def tensorflow_collectives(name: Any) -> Collectives:
    """The object collectives over Horovod's TensorFlow ops (``name(prefix)``: each call's collective
    name, the same sequence on every rank): the adapter's, and :mod:`hvdtrain.keras`'s checkpoints'."""
    return Collectives(hvd, lambda values: tf.constant(values, dtype=tf.float64), name, _host_tensor)


def _as_tensor(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: tf.convert_to_tensor(v) for k, v in value.items()}
    return tf.convert_to_tensor(value)


@pipelined
class TensorFlowAdapter(FrameworkAdapter):
    """Gradients exchanged by the run's :mod:`~hvdtrain.core.exchange` (by default Horovod's
    allreduce as ``hvd.DistributedGradientTape`` runs it: optional fp16 compression, average or
    Adasum; with gradient accumulation, local sums then one grouped allreduce); variables broadcast
    from rank 0.

    With ``parallel.pipeline_stages > 1`` the adapter holds this rank's stage of the cut model in
    ``pipeline`` (a :class:`~hvdtrain.core.gpipe.GPipe` over
    :class:`hvdtrain.tensorflow.stage.TensorFlowStage`) and hands it the steps and the model state;
    the rest (learning rate, RNG, objects, sums) stays."""

    name = "tensorflow"
    checkpoint_files = (MODEL_FILE, OPTIMIZER_FILE)  # what load_state reads, pipeline stages too
    as_batch = staticmethod(_as_tensor)  # a batch (an array or a dict of them) as tensors

    def init(self, config: Any) -> DistContext:
        train_config = config.train
        launch.start(hvd, config)  # the launcher's environment, HOROVOD_* from comm, hvd.init(), Slurm's world
        threads = train_config.threads or max(1, (os.cpu_count() or 1) // max(1, hvd.local_size()))
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
        if reproducible.enabled(config):  # bitwise mode: fixed threads, deterministic ops
            bitwise.enter(config)
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
        keras.utils.set_random_seed(train_config.seed)
        if train_config.deterministic:
            tf.config.experimental.enable_op_determinism()
        keras.mixed_precision.set_global_policy(
            {"none": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[train_config.mixed_precision])
        self.gpu = bool(tf.config.list_logical_devices("GPU"))
        self._collective_id = 0  # eager collectives get a new name per call, the same sequence on every rank
        self.collectives = tensorflow_collectives(self._name)
        self.pipeline = GPipe.open(self, hvd, config)  # None without pipeline stages
        return self.context()

    def prepare(self, task: Any, config: Any) -> None:
        train_config, optim_config = config.train, config.optim
        self.task = task
        self.model = task.model
        if self.task_lr and getattr(task, "scheduler", None) is not None:
            # the task's LearningRateSchedule becomes its optimizer's: evaluated at the optimizer's
            # update count inside the traced step, saved and resumed with the optimizer's variables
            task.optimizer.learning_rate = task.scheduler
        self.loss_scaling = train_config.mixed_precision == "fp16"
        self.optimizer = keras.mixed_precision.LossScaleOptimizer(task.optimizer) if self.loss_scaling \
            else task.optimizer
        self.inner_optimizer = task.optimizer
        self.accumulation = train_config.grad_accumulation
        self.grad_clip_norm = optim_config.grad_clip_norm
        self.nonfinite = train_config.nonfinite
        threads = tf.config.threading.get_intra_op_parallelism_threads() or (os.cpu_count() or 1)
        # The gradient exchange (hvdtrain.core.exchange), planned once (hvdtrain.core.exchange_plan; the
        # rulebook allowed it) and built by hvdtrain.tensorflow.exchanges below, which the step calls
        # between the tape's gradients and the update.
        self.plan = plan_exchange(config, Workers(hvd.size(), hvd.local_size(),
                                                  bool(tf.config.list_logical_devices("GPU")), threads,
                                                  os.cpu_count() or 1))
        if not self.model.built:
            sample, _ = task.train_data.get_batch(np.arange(1), 0)
            self.model(_as_tensor(sample), training=False)
        self.trainable = self.model.trainable_variables
        self.buffers = [v for v in self.model.non_trainable_variables
                        if v.dtype in ("float16", "bfloat16", "float32", "float64")]  # BatchNorm statistics
        self._fine_tuning(task, config)
        # the exchange, the micro-batch's step, the accumulators and whether the optimizer state is
        # sharded (its slots are created here, whole or 1/N, so they can be broadcast)
        wiring = exchanges.build(self.plan, config, self)
        self.exchange, self.optimizer_state, self._train_step = wiring.exchange, wiring.state, wiring.train_step
        self.accumulators = wiring.accumulators
        self._steps: dict[bool, tuple[Any, Any]] = {}  # per frozen-backbone mode: (apply, accumulate) step
        # train.compile (hvdtrain.tensorflow.compiled): the forward and gradient by XLA, the rest as it is
        self.compile_mode = train_config.compile
        self._gradient_fns: dict[bool, Any] = {}  # per frozen-backbone mode, like the steps
        self._compile_clock = FirstStepClock(compiled.describe(self.compile_mode), hvd.rank())
        self._eval = tf.function(self._eval_step, reduce_retracing=True, autograph=False)
        # The schedule's learning rate goes into the update step's graph (set_learning_rate records
        # it) where the optimizer's is a variable: the sharded optimizer sets its own eagerly.
        self._lr_variable = None if self.task_lr else self.optimizer_state.graph_learning_rate(self.optimizer)
        self._lr = float(self._lr_variable.numpy()) if self._lr_variable is not None else None

    plan: ExchangePlan | None = None  # the run's exchange plan, set by prepare()
    optimizer_state = WholeState()  # whole or sharded optimizer state (hvdtrain.tensorflow.exchanges), set by prepare()
    _lr_variable: Any = None  # the optimizer's LR variable the update step assigns (prepare(); None: set eagerly)
    control: BackboneControl | None = None  # fine-tuning controls (hvdtrain.core.finetune), set by prepare()
    freeze_epochs = 0

    def describe_optimizer(self, task: Any) -> OptimizerFacts | None:
        """The task's Keras optimizer and LR schedule (refused by name when they are not ones)."""
        optimizer, scheduler = task.optimizer, getattr(task, "scheduler", None)
        schedule_type = keras.optimizers.schedules.LearningRateSchedule
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ConfigError(f"TrainTask.optimizer: {type_name(optimizer)} is not a Keras optimizer")
        own = getattr(optimizer, "_learning_rate", None)
        own = own if isinstance(own, schedule_type) else None
        if scheduler is not None and not isinstance(scheduler, schedule_type):
            raise ConfigError(f"TrainTask.scheduler: {type_name(scheduler)} is not a "
                              f"keras.optimizers.schedules.LearningRateSchedule (accepted: one, or an optimizer "
                              f"built with one)")
        if scheduler is not None and own is not None:
            raise ConfigError(f"TrainTask.scheduler: the optimizer {type_name(optimizer)} already has the schedule "
                              f"{type_name(own)}; give one of them")
        schedule = scheduler if scheduler is not None else own
        if schedule is not None:
            lr = float(np.asarray(schedule(optimizer.iterations)))
            base = getattr(schedule, "initial_learning_rate", None)
        else:
            lr = base = float(np.asarray(optimizer.learning_rate))
        return OptimizerFacts(type_name(optimizer), lr, float(base) if base is not None else None,
                              bool(getattr(optimizer, FROM_CONFIG, False)),
                              type_name(schedule) if schedule is not None else None)

    def learning_rate(self) -> float:
        # pipeline stages set the adapter's optimizer only
        optimizer = self.optimizer_state.learning_rate_owner(getattr(self, "inner_optimizer", None) or self.optimizer)
        return float(np.asarray(optimizer.learning_rate))

    def _fine_tuning(self, task: Any, config: Any) -> None:
        """``self.control`` for ``model.freeze_backbone_epochs`` and ``optim.backbone_lr_factor``."""
        if not finetune.enabled(config):
            return
        self.control = BackboneControl(self.model, self.trainable, head_variables(task, self.model))
        self.freeze_epochs = config.model.freeze_backbone_epochs
        if config.optim.backbone_lr_factor != 1.0:
            self.control.set_lr_factor(self.inner_optimizer, config.optim.backbone_lr_factor)

    @property
    def _frozen(self) -> bool:
        return self.control is not None and self.control.frozen

    def begin_epoch(self, epoch: int) -> None:
        if self.control is not None:
            self.control.set_frozen(epoch < self.freeze_epochs)

    def _step_functions(self) -> tuple[Any, Any]:
        """The traced (apply, accumulate) steps for the current mode: a frozen backbone's step is
        traced with its BatchNormalization layers non-trainable and updates the head only."""
        if self._frozen not in self._steps:  # autograph=False: the steps branch on tensors only through
            # tf.cond, so AutoGraph's rewrite (of Horovod's functions, at every trace) is start-up time only
            self._steps[self._frozen] = (tf.function(self._apply_step, reduce_retracing=True, autograph=False),
                                         tf.function(self._accumulate_step, reduce_retracing=True, autograph=False))
        return self._steps[self._frozen]

    def _loss(self, inputs: Any, targets: Any, training: bool) -> tuple[Any, Any]:
        outputs = self.model(inputs, training=training)
        return outputs, tf.cast(self.task.loss_fn(outputs, targets), tf.float32)

    def _scale_loss(self, loss: Any, weight: Any) -> Any:
        scaled = loss * weight
        return self.optimizer.scale_loss(scaled) if self.loss_scaling else scaled

    def _update(self, grads: list[Any]) -> Any:
        """Apply the allreduced ``grads`` if they are finite (``train.nonfinite=error`` without loss
        scaling: apply them, the run stops if they were not); return whether they were. With loss
        scaling: unscale first; after a finite update grow the scale every ``dynamic_growth_steps``,
        after an overflow halve it (Keras's LossScaleOptimizer rule)."""
        grads = [tf.convert_to_tensor(g) for g in grads]
        # sharded: this rank's slices of the flat gradients and of the parameters, the shard optimizer
        variables, optimizer = self.optimizer_state.update_target(self.trainable, self.inner_optimizer)
        if self._frozen:  # (read when traced) a frozen backbone gets no update at all: the head's only
            keep = self.control.head_mask
            grads = [g for g, k in zip(grads, keep) if k]
            variables = [v for v, k in zip(variables, keep) if k]
        scaler = self.optimizer if self.loss_scaling else None
        if scaler is not None:
            grads = [g / tf.cast(scaler.dynamic_scale, g.dtype) for g in grads]
        norm = self.optimizer_state.global_norm(grads)  # sharded: across the ranks' slices (distributed)
        finite = tf.math.is_finite(norm)
        if self.grad_clip_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, self.grad_clip_norm, use_norm=norm)
        if scaler is None and self.nonfinite == "error":
            # (read when traced) the run stops at a non-finite update either way, so the update need not
            # wait for the whole gradient's norm: each variable is updated as soon as its gradient is
            # reduced, as in a loop without the check, and the host reads ``finite`` at this very step. A
            # non-finite update applied here is never saved: save_state refuses weights that are not finite.
            optimizer.apply_gradients(zip(grads, variables))
            return finite

        def apply():
            optimizer.apply_gradients(zip(grads, variables))
            if scaler is not None:
                grow = tf.equal(scaler.step_counter, scaler.dynamic_growth_steps - 1)
                scaler.dynamic_scale.assign(tf.where(grow, scaler.dynamic_scale * 2.0, scaler.dynamic_scale))
                scaler.step_counter.assign(tf.where(grow, tf.zeros_like(scaler.step_counter),
                                                    scaler.step_counter + 1))
            return tf.constant(True)

        def skip():
            if scaler is not None:
                scaler.step_counter.assign(tf.zeros_like(scaler.step_counter))
                scaler.dynamic_scale.assign(scaler.dynamic_scale * 0.5)
            return tf.constant(False)

        return tf.cond(finite, apply, skip)

    compile_mode = "none"
    _compile_clock = FirstStepClock()  # times a compiled first step (this one: eager, never reports)

    def _gradients(self, inputs: Any, targets: Any, weight: Any) -> tuple[Any, list[Any]]:
        """The loss and this micro-batch's local gradients (what train.compile hands to XLA)."""
        with tf.GradientTape() as tape:
            if self._frozen:  # its BatchNormalization layers are non-trainable now: watch their variables too
                tape.watch(tf_variables(self.trainable))
            _, loss = self._loss(inputs, targets, training=True)
            scaled = self._scale_loss(loss, weight)
        return loss, tape.gradient(scaled, tf_variables(self.trainable))

    def _local_gradients(self, inputs: Any, targets: Any, weight: Any) -> tuple[Any, list[Any]]:
        """:meth:`_gradients`, compiled by XLA with train.compile (traced per frozen-backbone mode)."""
        if self._frozen not in self._gradient_fns:
            self._gradient_fns[self._frozen] = compiled.gradient_function(self._gradients, self.compile_mode)
        return self._gradient_fns[self._frozen](inputs, targets, weight)

    def _apply_step(self, inputs: Any, targets: Any, scalars: Any) -> Any:
        """One update, inside ``tf.function``: ``scalars`` (float64) holds the micro-batch's loss weight
        and, where the optimizer's LR is a variable, the learning rate it gets here; then local gradients
        (plus the accumulated ones), the exchange's ``reduce``, the update, the exchange's ``after_update``.
        Returns the loss and whether the update was applied, as one float32 pair: one read on the host."""
        if self._lr_variable is not None:  # (read when traced)
            self._lr_variable.assign(tf.cast(scalars[1], self._lr_variable.dtype))
        loss, grads = self._local_gradients(inputs, targets, tf.cast(scalars[0], tf.float32))
        if self.accumulators:
            grads = [a + tf.convert_to_tensor(g) for a, g in zip(self.accumulators, grads)]
            for a in self.accumulators:
                a.assign(tf.zeros_like(a))
        applied = self._update(self.exchange.reduce(grads))  # distributed: the gradient exchange
        self.optimizer_state.after_update()  # sharded, distributed: the updated slices make the whole model
        self.exchange.after_update()
        return tf.stack([loss, tf.cast(applied, tf.float32)])

    def _accumulate_step(self, inputs: Any, targets: Any, scalars: Any) -> Any:
        loss, grads = self._local_gradients(inputs, targets, tf.cast(scalars[0], tf.float32))
        for a, g in zip(self.accumulators, grads):
            a.assign_add(tf.convert_to_tensor(g))
        return tf.stack([loss, tf.constant(1.0)])

    def _eval_step(self, inputs: Any, targets: Any) -> dict[str, Any]:
        outputs, loss = self._loss(inputs, targets, training=False)
        count = tf.cast(tf.shape(targets)[0], tf.float32)
        sums = {"loss_sum": loss * count, "count": count}
        sums.update({k: tf.cast(v, tf.float32) for k, v in self.task.metric_sums(outputs, targets).items()})
        return sums

    def _seed_states(self) -> list[Any]:
        """The model's per-layer random-seed states (Keras Dropout and friends): int [seed, counter]."""
        return [v for v in self.model.variables if "seed_generator_state" in getattr(v, "path", v.name)]

    def broadcast_state(self, root_rank: int = 0) -> None:
        # model and optimizer state: whole, or each rank its slice of the root's (ZeRO)
        self.optimizer_state.broadcast(self.model, self.optimizer, root_rank)  # distributed
        # The layers' seed states came from rank 0 too: each rank draws its own dropout masks.
        offset_seed_states(self._seed_states(), hvd.rank())

    def model_buffers(self) -> list[np.ndarray] | None:
        """This rank's own running statistics (BatchNorm moving means and variances) as NumPy
        copies (None with pipeline stages, whose stages average theirs in place): what a step
        checkpoint keeps per rank."""
        if self.pipeline is not None:
            return None
        return [np.array(v.numpy()) for v in self.buffers]

    def set_model_buffers(self, values: list[np.ndarray]) -> None:
        """Put back what :meth:`model_buffers` returned."""
        for variable, value in zip(self.buffers, values):
            variable.assign(value)

    def sync_model_buffers(self) -> None:
        stats = self.buffers  # a frozen backbone's statistics are equal everywhere and stay as they are
        if self._frozen:
            stats = [v for v in stats if id(v) not in self.control.frozen_stats]
        if not stats or hvd.size() == 1 or self.exchange.buffers_agree:
            return
        averaged = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in stats], op=hvd.Average,  # distributed
                                         name=self._name("sync_buffers"))
        for variable, value in zip(stats, averaged):
            variable.assign(value)

    def reseed(self, seed: int) -> None:
        from keras.src.random.seed_generator import global_seed_generator

        tf.random.set_seed(seed)
        global_seed_generator().state.assign(np.asarray([seed, 0], dtype=np.int64))

    def set_learning_rate(self, lr: float) -> None:
        """The schedule's LR for the next update. Data parallelism (the optimizer's LR a variable)
        records it, and the update's traced step assigns it inside its graph: Keras's setter, an
        eager assignment at every step, cost about 0.5 ms of the main thread per step (measured
        with ``benchmarks/workers/overhead.py``, 2 ranks on 2 loaded cores). The sharded optimizer,
        pipeline stages and an LR schedule object are set here, as before."""
        if self._lr_variable is not None:
            self._lr = float(lr)
            return
        self.optimizer.learning_rate = lr
        self.optimizer_state.set_learning_rate(lr)  # sharded: the shard optimizer's too

    def gather_state(self) -> None:
        self.optimizer_state.gather()  # sharded, distributed: rank 0 holds the whole optimizer state to save

    def _optimizer_variables(self, checkpoint: bool = False) -> list[Any]:
        """The optimizer's variables; sharded: in a checkpoint the whole state in data parallelism's
        layout (:meth:`ShardedOptimizer.checkpoint_variables`), in memory this rank's."""
        return self.optimizer_state.optimizer_variables(self.optimizer, checkpoint)

    def convert_batch(self, inputs: Any, targets: Any) -> tuple[Any, Any]:
        """The batch as tensors, converted in the prefetch thread: on the loop's thread, right after a
        step (the first eager operation after a step is slow), hvdtrain's main thread spent 0.47 ms per
        step more than a hand-written loop's, 0.29 ms with the conversion here
        (``benchmarks/workers/batch_conversion.py``; BENCHMARKS.md). Pipeline stages cut their
        micro-batches from the batch as loaded."""
        if self.pipeline is not None:
            return inputs, targets
        return _as_tensor(inputs), tf.convert_to_tensor(targets)

    def train_step(self, inputs: Any, targets: Any, apply_update: bool = True, weight: float | None = None) -> Any:
        # the planned exchange's micro-batch step (hvdtrain.tensorflow.exchanges): graph_train_step, or
        # bitwise mode's, where the exchange runs each micro-batch
        return self._train_step(inputs, targets, apply_update, weight)

    def graph_train_step(self, inputs: Any, targets: Any, apply_update: bool = True,
                         weight: float | None = None) -> Any:
        """One micro-batch through the traced steps: accumulate, or apply the update."""
        train_apply, train_accumulate = self._step_functions()
        step = train_apply if apply_update or not self.accumulators else train_accumulate
        # The loss weight and the LR travel as one tensor, and the loss and the finite check come back as
        # one: each eager conversion or read costs the main thread about 50 us between steps (measured).
        scalars = [1.0 / self.accumulation if weight is None else weight]
        if step is train_apply and self._lr_variable is not None:
            scalars.append(self._lr)
        self._compile_clock.start()  # train.compile: the first step compiles, timed
        loss, applied = step(_as_tensor(inputs), tf.convert_to_tensor(targets),
                             tf.constant(scalars, dtype=tf.float64)).numpy()  # one host sync per step
        self._compile_clock.stop()
        if apply_update and not applied:  # train.nonfinite needs the check at every update
            if self.nonfinite == "error" and not self.loss_scaling:
                raise NonFiniteGradientError(f"the allreduced gradient is not finite (loss on this rank {float(loss)})")
            self.skipped_updates += 1  # with fp16 loss scaling: an overflow the scaler skipped
        # a NumPy scalar: the loop's running sums stay Python arithmetic, not eager TensorFlow operations
        return loss

    def eval_step(self, inputs: Any, targets: Any) -> dict[str, Any]:
        return dict(self._eval(_as_tensor(inputs), tf.convert_to_tensor(targets)))

    def _name(self, prefix: str) -> str:
        self._collective_id += 1
        return f"hvdtrain.{prefix}.{self._collective_id}"

    def rng_state(self) -> dict[str, Any]:
        from keras.src.random.seed_generator import global_seed_generator

        return {"keras_global_seed": np.asarray(global_seed_generator().state.numpy()).tolist()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        from keras.src.random.seed_generator import global_seed_generator

        global_seed_generator().state.assign(np.asarray(state["keras_global_seed"], dtype=np.int64))

    def snapshot(self) -> Any:
        return [np.array(v.numpy()) for v in list(self.model.variables) + self._optimizer_variables()]

    def restore_snapshot(self, snapshot: Any) -> None:
        for variable, value in zip(list(self.model.variables) + self._optimizer_variables(), snapshot):
            variable.assign(value)

    def restart_window(self, accumulation: int) -> None:
        super().restart_window(accumulation)
        for a in self.accumulators:  # a window cut short: its gradients go
            a.assign(tf.zeros_like(a))

    def save_state(self, directory: Path) -> None:
        if not all(bool(np.isfinite(v.numpy()).all()) for v in self.model.trainable_variables):
            raise NonFiniteStateError("model parameters are not finite")
        try:
            save_variables(Path(directory) / MODEL_FILE, self.model.variables)
            save_variables(Path(directory) / OPTIMIZER_FILE, self._optimizer_variables(checkpoint=True))
        finally:
            self.optimizer_state.after_save()  # sharded, distributed: the slots not saved still come

    def load_state(self, directory: Path) -> None:
        load_variables(Path(directory) / MODEL_FILE, self.model.variables)
        load_variables(Path(directory) / OPTIMIZER_FILE, self._optimizer_variables(checkpoint=True))
