"""Keras 3 optimizers on Horovod for ``model.fit`` (public as :mod:`hvdtrain.keras`): any Keras 3
optimizer whose gradients go through the Trainer's gradient exchange before its update, and a
learning-rate warm-up that is a schedule (so it resumes exactly with the optimizer's iteration count).

The exchange is chosen by the same config keys as the Trainer's and ``hvdtrain.torch.prepare``'s,
planned and built by :mod:`hvdtrain.tensorflow.keras_exchange` (Horovod's allreduce by default: the
function ``hvd.DistributedGradientTape`` applies, with the same arguments), and called inside the
traced train step that ``model.fit`` builds.
"""

from __future__ import annotations

from typing import Any

import keras

from hvdtrain.core.config_error import ConfigError
from hvdtrain.tensorflow import keras_exchange


class _Distributed:
    """Mixed in before the user's optimizer class: :meth:`apply` exchanges the gradients first."""

    _hvdtrain_planned: Any = None  # keras_exchange.Planned

    def build(self, variables: Any) -> None:
        """The optimizer's own variables, then the exchange's (eagerly)."""
        super().build(variables)
        self._hvdtrain_planned.exchange_for(self, list(variables))

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        """The gradients through the planned exchange (a collective), then the optimizer's own
        ``apply``, then the exchange's ``after_update`` (local SGD's averaging)."""
        grads = list(grads)
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        if not grads:
            return super().apply(grads, trainable_variables)
        exchange = self._hvdtrain_planned.exchange_for(self, variables)
        result = super().apply(exchange.reduce(grads), trainable_variables)  # distributed
        exchange.after_update()
        return result


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, compression: Any = None, op: Any = None,
                         groups: int | None = 1, **config: Any) -> keras.optimizers.Optimizer:
    """``optimizer`` (any Keras 3 optimizer, with a float learning rate or a
    ``LearningRateSchedule``) made distributed: before each update its gradients go through the
    gradient exchange the Trainer would run for the same keys, inside the step ``model.fit``
    traces (or a ``tf.GradientTape`` loop calling ``optimizer.apply``). Returns the same object
    (its variables, schedule and settings as given): its class becomes a subclass of its own class,
    of the same name, that adds the exchange, so ``model.save`` still records the original class.

    By default Horovod's allreduce averages the gradients. ``compression``:
    ``hvd.Compression.none`` or ``hvd.Compression.fp16`` (float16 on the wire, the same as
    ``comm__compression="fp16"``); ``op``: ``hvd.Average`` or ``hvd.Adasum`` (the same as
    ``comm__reduction="adasum"``); ``groups``: 1 (default) fuses all gradients into one grouped
    allreduce, ``None`` reduces each as soon as it exists (Adasum always reduces tensor by tensor).

    ``config``: hvdtrain's keys of the exchange, dotted names with ``__`` for dots as
    ``hvdtrain.torch.prepare`` takes them: ``comm__compression="powersgd"`` (``comm__powersgd_rank``,
    ``comm__powersgd_start_step``, ``comm__powersgd_min_size``), ``"topk"`` (``comm__topk_ratio``),
    ``comm__local_sgd_steps=H`` (``comm__local_sgd_average_optimizer``), ``train__fp16_allreduce``
    (float16 PowerSGD factors or top-k values). A combination the rulebook refuses, a key that
    contradicts ``compression``/``op``, and a Trainer-only key (``parallel__shard_optimizer``,
    ``train__reproducible``, ``parallel__pipeline_stages``) raise
    :class:`~hvdtrain.core.config.ConfigError` with one line naming them. PowerSGD's and top-k's
    error feedback and local SGD's replicas are each worker's own: :class:`hvdtrain.keras.Checkpoints`
    keeps them (``comm_state.npz``) for an exact resume on the same number of workers; on another
    they start afresh, as in the Trainer. Local SGD averages the optimizer's trainable variables
    every H updates; in between, and in the model's non-trainable variables (BatchNorm statistics),
    the workers differ. Keras's ``gradient_accumulation_steps`` runs the exchange on each
    micro-batch's gradients (refused with hvdtrain's own exchanges).

    With ``keras.mixed_precision`` ``mixed_float16`` pass a ``keras.optimizers.LossScaleOptimizer``
    (the exchange then happens before its overflow check, so every worker skips the same updates);
    an unwrapped optimizer is refused under that policy, since Keras would wrap it and each worker
    would check its own gradients.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer: {type(optimizer).__name__} is not a Keras 3 optimizer "
                        f"(keras.optimizers.Optimizer)")
    if isinstance(optimizer, _Distributed):
        raise ConfigError(f"DistributedOptimizer: {type(optimizer).__name__} {optimizer.name!r} is already distributed")
    policy = keras.mixed_precision.global_policy().name
    if policy == "mixed_float16" and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ConfigError(f"DistributedOptimizer: under the dtype policy {policy!r} pass "
                          f"keras.optimizers.LossScaleOptimizer({type(optimizer).__name__}(...)), not "
                          f"{type(optimizer).__name__}: Keras would wrap it outside the averaging")
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    checked = keras_exchange.check(compression, op, config, getattr(inner, "gradient_accumulation_steps", None),
                                   inner is not optimizer)
    cls = type(optimizer)
    distributed = type(cls.__name__, (_Distributed, cls), {"__module__": cls.__module__,
                                                           "__qualname__": cls.__qualname__})
    object.__setattr__(optimizer, "__class__", distributed)
    object.__setattr__(optimizer, "_hvdtrain_planned", keras_exchange.Planned(checked, groups))  # not tracked
    return optimizer


@keras.saving.register_keras_serializable(package="hvdtrain")
class WarmUp(keras.optimizers.schedules.LearningRateSchedule):
    """A linear learning-rate warm-up in front of ``after`` (a float or a ``LearningRateSchedule``):
    at update ``step < warmup_steps`` the LR is ``start + (after(step) - start) * step /
    warmup_steps`` (``after`` evaluated at the same step), from then on ``after(step)``. A function
    of the optimizer's iteration count only, so a resumed run (the count restored with the
    optimizer's variables) continues it exactly. Horovod's ``LearningRateWarmupCallback`` ramps
    to ``lr * hvd.size()`` over epochs; here pass that LR (or schedule) as ``after``."""

    def __init__(self, after: Any, warmup_steps: int, start: float = 0.0):
        if int(warmup_steps) < 1:
            raise ConfigError(f"WarmUp: warmup_steps={warmup_steps!r} must be at least 1")
        self.after, self.warmup_steps, self.start = after, int(warmup_steps), float(start)

    def __call__(self, step: Any) -> Any:
        step = keras.ops.cast(step, "float32")
        target = self.after(step) if callable(self.after) else keras.ops.cast(self.after, "float32")
        ramp = self.start + (target - self.start) * step / float(self.warmup_steps)
        return keras.ops.where(step < self.warmup_steps, ramp, target)

    def get_config(self) -> dict[str, Any]:
        """The constructor's arguments (a schedule ``after`` serialized with Keras)."""
        after = keras.saving.serialize_keras_object(self.after) if callable(self.after) else self.after
        return {"after": after, "warmup_steps": self.warmup_steps, "start": self.start}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "WarmUp":
        """Inverse of :meth:`get_config`."""
        after = config["after"]
        if isinstance(after, dict):
            after = keras.saving.deserialize_keras_object(after)
        return cls(after, config["warmup_steps"], config.get("start", 0.0))
