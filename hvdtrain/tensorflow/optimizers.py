"""Keras optimizers that compute torch's update: coupled L2 weight decay for SGD and Adam, torch's
momentum (the LR applied to the whole velocity) and Adam's epsilon after the bias correction, and
:func:`build_optimizer`, the optimizer an ``optim`` section names, marked as built from it.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hvdtrain.core.config import ConfigError
from hvdtrain.core.optimizer_policy import mark_from_config
from hvdtrain.tensorflow.compression import tf_variables
from hvdtrain.tensorflow.finetune import LearningRateFactors


class _CoupledWeightDecay:
    """L2 weight decay added to the gradient before the update (torch's ``weight_decay`` for SGD
    and Adam); Keras's own ``weight_decay`` is decoupled. Respects ``exclude_from_weight_decay``."""

    def __init__(self, *args: Any, l2: float = 0.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.l2 = l2

    def _backend_update_step(self, grads: list[Any], trainable_variables: list[Any], learning_rate: Any) -> None:
        if self.l2:
            # tf.identity: every gradient made in this graph (Keras's all-reduce insists on one graph)
            grads = [g + tf.cast(self.l2, g.dtype) * tf.cast(tf_variables([v])[0], g.dtype)
                     if self._use_weight_decay(v) else tf.identity(g) for g, v in zip(grads, trainable_variables)]
        super()._backend_update_step(grads, trainable_variables, learning_rate)


class _TorchSGDStep:
    """SGD's step as torch computes it: momentum on the gradient with the LR applied to the whole
    velocity (``v = m v + g; w -= lr v``). Keras folds the LR into the velocity (``v = m v - lr g;
    w += v``), which differs whenever the LR changes (warmup, decay). Dense gradients go through
    TensorFlow's fused ApplyMomentum kernel, which computes this very rule."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        if self.momentum == 0 or self.nesterov:
            return super().update_step(gradient, variable, learning_rate)
        velocity = self.momentums[self._get_variable_index(variable)]
        dtype = variable.dtype
        gradient = tf.cast(gradient, dtype)
        if isinstance(gradient, tf.IndexedSlices):
            self.assign(velocity, velocity * tf.cast(self.momentum, dtype) + gradient)
            self.assign_sub(variable, velocity * tf.cast(learning_rate, dtype))
            return None
        # TensorFlow's ApplyMomentum kernel computes exactly this rule (accum = m accum + g; var -= lr accum)
        # in one pass over the tensors, where the rule as separate operations makes four, each through a
        # temporary: the same bits (tests/unit/test_tf_sgd_kernel.py), about 0.9 ms less per update of
        # small_cnn's 1.6M weights on one core (benchmarks/tf_sgd_kernel.py)
        tf.raw_ops.ResourceApplyMomentum(var=variable.handle, accum=velocity.handle,
                                         lr=tf.cast(learning_rate, dtype), grad=gradient,
                                         momentum=tf.cast(self.momentum, dtype), use_locking=False, use_nesterov=False)
        return None


class _TorchAdamStep:
    """Adam's step as torch computes it: epsilon added after the second moment's bias correction
    (``lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)``); Keras adds it before, which makes the
    effective epsilon ``eps / sqrt(1 - b2^t)``, 30 times torch's at the first step."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        gradient = tf.cast(gradient, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        self.assign_add(m, (gradient - m) * (1 - beta_1))
        self.assign_add(v, (tf.square(gradient) - v) * (1 - beta_2))
        denominator = tf.sqrt(v) / tf.sqrt(1 - tf.pow(beta_2, step)) + tf.cast(self.epsilon, dtype)
        self.assign_sub(variable, tf.cast(learning_rate, dtype) / (1 - tf.pow(beta_1, step)) * m / denominator)


class CoupledSGD(LearningRateFactors, _CoupledWeightDecay, _TorchSGDStep, keras.optimizers.SGD):
    """SGD as torch runs it: coupled weight decay, torch's momentum (:class:`_TorchSGDStep`)."""


class CoupledAdam(LearningRateFactors, _CoupledWeightDecay, _TorchAdamStep, keras.optimizers.Adam):
    """Adam as torch runs it: coupled weight decay, torch's epsilon placement."""


class TorchAdamW(LearningRateFactors, _TorchAdamStep, keras.optimizers.AdamW):
    """AdamW (decoupled weight decay, as in torch) with torch's epsilon placement."""


def low_rank_variables(model: Any) -> list[Any]:
    """Trainable variables of at most one dimension: biases, normalisation scales and shifts."""
    return [v for v in model.trainable_variables if len(v.shape) <= 1]


def build_optimizer(optim_config: Any, exclude_from_weight_decay: list[str] | None = None,
                    exclude_variables: list[Any] | None = None) -> keras.optimizers.Optimizer:
    """The Keras optimizer an :class:`~hvdtrain.core.config.OptimConfig` names, marked as built from
    ``optim.*``: hvdtrain's schedule sets its LR before every update
    (:mod:`hvdtrain.core.optimizer_policy`). Variables whose names contain a string in ``exclude_from_weight_decay``, and
    those in ``exclude_variables`` (e.g. :func:`low_rank_variables`), get no weight decay. Weight
    decay means what it means in torch: coupled L2 for ``sgd`` and ``adam``, decoupled for
    ``adamw``. Adam and AdamW use torch's epsilon (1e-8) and its placement."""
    name, lr, wd = optim_config.name, optim_config.lr, optim_config.weight_decay
    if name == "sgd":
        opt = CoupledSGD(learning_rate=lr, momentum=optim_config.momentum, l2=wd)
    elif name == "adam":
        opt = CoupledAdam(learning_rate=lr, epsilon=1e-8, l2=wd)
    elif name == "adamw":
        opt = TorchAdamW(learning_rate=lr, weight_decay=wd, epsilon=1e-8)
    else:
        raise ConfigError(f"optim.name: {name!r} is not allowed; choose one of: sgd, adam, adamw")
    if exclude_from_weight_decay or exclude_variables:
        opt.exclude_from_weight_decay(var_list=exclude_variables, var_names=exclude_from_weight_decay)
    return mark_from_config(opt)
