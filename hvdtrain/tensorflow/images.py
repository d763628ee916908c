"""uint8 NHWC image batches to normalised float32 NHWC tensors inside a Keras model.

:func:`normalize_inputs` wraps a model so that it takes the pipeline's uint8 batches; the
conversion runs on the device the model runs on (a quarter of float32's bytes cross to it).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from hvdtrain.data.normalize import scaled_constants


def to_float_nhwc(x: tf.Tensor) -> tf.Tensor:
    """``(x - 255 mean) / (255 std)`` of a uint8 NHWC batch as float32; other tensors pass through."""
    if x.dtype != tf.uint8:
        return x
    mean, std = scaled_constants(int(x.shape[-1]))
    return (tf.cast(x, tf.float32) - tf.constant(mean)) / tf.constant(std)


class NormalizeImages(keras.layers.Layer):
    """A float32 layer applying :func:`to_float_nhwc`."""

    def __init__(self, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)

    def call(self, x):
        return to_float_nhwc(x)


def normalize_inputs(model: keras.Model, input_shape: tuple[int, int, int]) -> keras.Model:
    """``model`` behind a uint8 input of ``input_shape`` (H, W, C) and :class:`NormalizeImages`."""
    inputs = keras.Input(input_shape, dtype="uint8")
    return keras.Model(inputs, model(NormalizeImages(name="normalize_images")(inputs)), name=model.name)
