"""Keras 3 optimizers on Horovod for ``model.fit`` (public as :mod:`hvdtrain.keras`): any Keras 3
optimizer whose gradients are averaged across the workers before its update, and a learning-rate
warm-up that is a schedule (so it resumes exactly with the optimizer's iteration count).

The averaging is :class:`hvdtrain.tensorflow.compression.Allreduce`, the reduction the
TensorFlowAdapter's step runs by default (``hvd.DistributedGradientTape``'s function with the same
arguments), called inside the traced train step that ``model.fit`` builds.
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import keras

from hvdtrain.tensorflow.compression import Allreduce


class _Distributed:
    """Mixed in before the user's optimizer class: :meth:`apply` averages the gradients first."""

    _hvdtrain_compression: Any = None
    _hvdtrain_op: Any = None
    _hvdtrain_groups: int | None = None

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        """The gradients averaged across the workers (Horovod), then the optimizer's own ``apply``."""
        grads = list(grads)
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        if grads and hvd.size() > 1:
            exchange = self.__dict__.get("_hvdtrain_exchange")
            if exchange is None or len(exchange.variables) != len(variables):
                exchange = Allreduce(variables, self._hvdtrain_compression, self._hvdtrain_op, self._hvdtrain_groups)
                object.__setattr__(self, "_hvdtrain_exchange", exchange)  # not a tracked attribute
            grads = exchange.reduce(grads)  # distributed
        return super().apply(grads, trainable_variables)


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, compression: Any = None, op: Any = None,
                         groups: int | None = 1) -> keras.optimizers.Optimizer:
    """``optimizer`` (any Keras 3 optimizer, with a float learning rate or a
    ``LearningRateSchedule``) made distributed: before each update its gradients are averaged
    across the Horovod workers, inside the step ``model.fit`` traces. Returns the same object
    (its variables, schedule and settings as given): its class becomes a subclass of its own class,
    of the same name, that adds the averaging, so ``model.save`` still records the original class.

    ``compression``: ``hvd.Compression.none`` (default) or ``hvd.Compression.fp16`` (float16 on
    the wire); ``op``: ``hvd.Average`` (default) or ``hvd.Adasum``; ``groups``: 1 (default) fuses
    all gradients into one grouped allreduce, ``None`` reduces each as soon as it exists (Adasum
    always reduces tensor by tensor). With ``keras.mixed_precision`` ``mixed_float16`` pass a
    ``keras.optimizers.LossScaleOptimizer`` (the averaging then happens before its overflow check,
    so every worker skips the same updates); an unwrapped optimizer is refused under that policy,
    since Keras would wrap it and each worker would check its own gradients.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer: {type(optimizer).__name__} is not a Keras 3 optimizer "
                        f"(keras.optimizers.Optimizer)")
    if isinstance(optimizer, _Distributed):
        raise ValueError(f"DistributedOptimizer: {type(optimizer).__name__} {optimizer.name!r} is already distributed")
    policy = keras.mixed_precision.global_policy().name
    if policy == "mixed_float16" and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(f"DistributedOptimizer: under the dtype policy {policy!r} pass "
                         f"keras.optimizers.LossScaleOptimizer({type(optimizer).__name__}(...)), not "
                         f"{type(optimizer).__name__}: Keras would wrap it outside the averaging")
    op = hvd.Average if op is None else op
    cls = type(optimizer)
    distributed = type(cls.__name__, (_Distributed, cls), {"__module__": cls.__module__,
                                                           "__qualname__": cls.__qualname__})
    object.__setattr__(optimizer, "__class__", distributed)
    object.__setattr__(optimizer, "_hvdtrain_compression", compression or hvd.Compression.none)
    object.__setattr__(optimizer, "_hvdtrain_op", op)
    # Horovod 0.28.1's grouped_allreduce fails with Adasum: Adasum reduces tensor by tensor
    object.__setattr__(optimizer, "_hvdtrain_groups", None if op == hvd.Adasum else groups)
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
            raise ValueError(f"WarmUp: warmup_steps={warmup_steps!r} must be at least 1")
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
