"""Fine-tuning controls for Keras (:mod:`hvdtrain.core.finetune`): the head's variables, the
backbone's learning-rate factor (:class:`LearningRateFactors`, which hvdtrain's optimizers mix in)
and a frozen backbone.

A frozen backbone's gradients are still computed and exchanged (every rank runs the same
collectives whatever the epoch); the update is applied to the head's variables only, so the
backbone gets no weight decay and no momentum step, and the backbone's BatchNormalization layers
are made non-trainable, which in Keras means they normalise with their moving statistics and do
not update them.
"""

from __future__ import annotations

from typing import Any

import keras

from hvdtrain.core import finetune
from hvdtrain.core.config import ConfigError


def _leaf_layers(model: Any) -> list[Any]:
    return [layer for layer in model._flatten_layers(include_self=False, recursive=True)  # noqa: SLF001
            if not getattr(layer, "_layers", None)]


def _output_layer(model: Any) -> Any:
    """The layer that computes ``model``'s (first) output, looking into nested models."""
    layer = model
    while isinstance(layer, keras.Model):
        if isinstance(layer, keras.Sequential):
            layer = layer.layers[-1]
        elif getattr(layer, "outputs", None):
            layer = layer.outputs[0]._keras_history[0]  # noqa: SLF001  (the operation that made it)
        else:
            break
    return layer


def head_variables(task: Any, model: Any) -> list[Any]:
    """The task's ``head()``, else the trainable variables of the layer named one of
    :data:`~hvdtrain.core.finetune.HEAD_NAMES`, else those of the layer computing the model's output
    (the final Dense of hvdtrain's Keras models, keras-hub classifiers' ``output_dense``)."""
    if task.head is not None:
        return list(task.head())
    for layer in model._flatten_layers(include_self=False, recursive=True):  # noqa: SLF001
        if layer.name in finetune.HEAD_NAMES and layer.trainable_variables:
            return list(layer.trainable_variables)
    output = _output_layer(model)
    if output is model or not output.trainable_variables:
        raise finetune.no_head_error(model.name)
    return list(output.trainable_variables)


class BackboneControl:
    """Which of ``trainable`` (the adapter's variable list) are the backbone; freezes and releases it."""

    def __init__(self, model: Any, trainable: list[Any], head: list[Any]):
        head_ids = {id(v) for v in head}
        self.head_mask = [id(v) in head_ids for v in trainable]
        finetune.check_split(sum(self.head_mask), len(trainable) - sum(self.head_mask))
        self.backbone = [v for v, is_head in zip(trainable, self.head_mask) if not is_head]
        backbone_ids = {id(v) for v in self.backbone}
        self.norms = [layer for layer in _leaf_layers(model)
                      if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
                      and all(id(v) in backbone_ids for v in layer.trainable_variables)]
        self.frozen_stats = {id(v) for layer in self.norms for v in layer.non_trainable_variables}
        self.frozen = False

    def set_frozen(self, frozen: bool) -> None:
        """Freeze or release the backbone (its BatchNormalization layers' ``trainable``)."""
        self.frozen = frozen
        for layer in self.norms:
            layer.trainable = not frozen

    def set_lr_factor(self, optimizer: Any, factor: float) -> None:
        """The backbone's learning rate at ``factor`` times the scheduled one in ``optimizer``."""
        if not isinstance(optimizer, LearningRateFactors):
            raise ConfigError(f"optim.backbone_lr_factor needs an optimizer from hvdtrain.tensorflow.build_optimizer "
                              f"(sgd, adam, adamw); the recipe's is {type(optimizer).__name__}")
        optimizer.set_lr_factor(self.backbone, factor)


class LearningRateFactors:
    """Mixed into a Keras optimizer: chosen variables' updates (and decoupled weight decay) use the
    learning rate times a factor, as a torch parameter group with its own ``lr`` would."""

    _lr_factors: dict | None = None

    def set_lr_factor(self, variables: list[Any], factor: float) -> None:
        """Scale the learning rate of ``variables`` by ``factor`` (before the update is traced)."""
        self._lr_factors = {**(self._lr_factors or {}), **{self._var_key(v): float(factor) for v in variables}}

    def _lr_factor(self, variable: Any) -> float:
        return (self._lr_factors or {}).get(self._var_key(variable), 1.0)

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        factor = self._lr_factor(variable)
        if factor != 1.0:
            learning_rate = learning_rate * keras.ops.cast(factor, keras.ops.dtype(learning_rate))
        return super().update_step(gradient, variable, learning_rate)

    def _apply_weight_decay(self, variables: list[Any]) -> None:
        if not self._lr_factors or self.weight_decay is None:
            return super()._apply_weight_decay(variables)
        for variable in variables:  # decoupled decay: lr * factor * weight_decay * w
            if self._use_weight_decay(variable):
                lr = keras.ops.cast(self.learning_rate, variable.dtype) * self._lr_factor(variable)
                variable.assign(variable - variable * keras.ops.cast(self.weight_decay, variable.dtype) * lr)
