"""A Hugging Face image-classification directory in TensorFlow/Keras 3 through keras-hub's
converters (ViT, DeiT, Swin, DINOv2: :data:`hvdtrain_recipes.image_classification.hf_models.KERAS_HUB_POOLING`):
the converted backbone, the pooling the Hugging Face classifier uses, and a Dense head named
``classifier`` with the same fresh weights the torch model gets."""

from __future__ import annotations

import keras
import numpy as np

from hvdtrain_recipes.image_classification.hf_models import (HEAD_NAME, HFImageModel, HFModelError,
                                                             check_keras_supported, head_weights)

PACKAGE = "hvdtrain_image"


@keras.saving.register_keras_serializable(package=PACKAGE)
class CheckpointNormalize(keras.layers.Layer):
    """uint8 NHWC to float32 ``(x - 255 mean) / (255 std)`` with the checkpoint's mean and std; a
    grayscale batch is repeated to ``channels``."""

    def __init__(self, mean, std, channels: int = 3, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.mean, self.std, self.channels = [float(v) for v in mean], [float(v) for v in std], int(channels)

    def call(self, x):
        x = keras.ops.cast(x, "float32")
        if x.shape[-1] == 1 and self.channels != 1:
            x = keras.ops.repeat(x, self.channels, axis=-1)
        mean = np.asarray(self.mean, np.float32) * np.float32(255)
        std = np.asarray(self.std, np.float32) * np.float32(255)
        return (x - mean) / std

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "std": self.std, "channels": self.channels}


@keras.saving.register_keras_serializable(package=PACKAGE)
class TokenPooling(keras.layers.Layer):
    """The Hugging Face classifier's pooling of a token sequence ``(batch, tokens, dim)``: ``cls``
    (token 0), ``mean`` (all tokens), ``cls+mean`` (token 0 next to the mean of the patch tokens,
    which start after ``skip`` tokens)."""

    def __init__(self, mode: str, skip: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.mode, self.skip = mode, int(skip)

    def call(self, x):
        if self.mode == "cls":
            return x[:, 0]
        if self.mode == "mean":
            return keras.ops.mean(x, axis=1)
        return keras.ops.concatenate([x[:, 0], keras.ops.mean(x[:, self.skip:], axis=1)], axis=-1)

    def get_config(self):
        return {**super().get_config(), "mode": self.mode, "skip": self.skip}


def _backbone(hf: HFImageModel):
    import keras_hub
    from safetensors import SafetensorError

    kwargs = {}
    if hf.model_type == "vit":  # keras-hub's ViT defaults to 1e-6; Hugging Face's ViT uses 1e-12
        kwargs["layer_norm_epsilon"] = float(hf.config.get("layer_norm_eps", 1e-12))
    try:
        return keras_hub.models.Backbone.from_preset(str(hf.path), **kwargs)
    except (KeyError, ValueError, OSError, SafetensorError) as exc:  # keys the converter looks for are absent, or wrong shapes
        raise HFModelError(f"keras-hub cannot convert the weights in {hf.path} ({hf.model_type}): "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def load_model(hf: HFImageModel, labels: list[str], seed: int, input_shape: tuple[int, int, int]) -> keras.Model:
    """uint8 ``input_shape`` (H, W, C) -> normalise -> keras-hub backbone -> pooling -> ``classifier``
    Dense with the head :func:`~hvdtrain_recipes.image_classification.hf_models.head_weights` draws."""
    pooling = check_keras_supported(hf)
    backbone = _backbone(hf)
    inputs = keras.Input(input_shape, dtype="uint8", name="images")
    x = CheckpointNormalize(hf.preprocessing.mean, hf.preprocessing.std, hf.channels, name="normalize")(inputs)
    if isinstance(backbone.input, dict):  # DINOv2 takes {"images": ...}
        x = {name: x for name in backbone.input}
    features = TokenPooling(pooling, 1 + int(hf.config.get("num_register_tokens", 0)), name="pooling")(backbone(x))
    head = keras.layers.Dense(len(labels), name=HEAD_NAME, dtype="float32")
    model = keras.Model(inputs, head(features), name=f"hf_{hf.model_type}")
    kernel, bias = head_weights(int(features.shape[-1]), len(labels), seed, hf.config.get("initializer_range", 0.02))
    if head.kernel.shape != kernel.shape:
        raise HFModelError(f"{hf.path}: the pooled features have {head.kernel.shape[0]} values, expected {kernel.shape[0]}")
    head.set_weights([kernel, bias])
    return model
