"""Keras 3 image models: the same small CNN and ResNet-18 as the torch side, and
``keras.applications.ResNet50`` (random init) for ResNet-50."""

from __future__ import annotations

import keras
from keras import layers

MODELS = ("small_cnn", "resnet18", "resnet50")


def small_cnn(input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """Two 3x3 convolutions, max-pool, dropout, two dense layers (the classic MNIST network)."""
    return keras.Sequential([
        keras.Input(input_shape),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2), layers.Dropout(0.25), layers.Flatten(),
        layers.Dense(128, activation="relu"), layers.Dropout(0.5),
        layers.Dense(num_classes, dtype="float32"),
    ], name="small_cnn")


def _basic_block(x, width: int, stride: int):
    shortcut = x
    y = layers.Conv2D(width, 3, stride, padding="same", use_bias=False)(x)
    y = layers.ReLU()(layers.BatchNormalization()(y))
    y = layers.BatchNormalization()(layers.Conv2D(width, 3, padding="same", use_bias=False)(y))
    if stride != 1 or x.shape[-1] != width:
        shortcut = layers.BatchNormalization()(layers.Conv2D(width, 1, stride, use_bias=False)(x))
    return layers.ReLU()(layers.Add()([y, shortcut]))


def resnet18(input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """ResNet-18; for images smaller than 64 pixels a 3x3 stem without max-pooling."""
    inputs = keras.Input(input_shape)
    if min(input_shape[:2]) < 64:
        x = layers.Conv2D(64, 3, padding="same", use_bias=False)(inputs)
        x = layers.ReLU()(layers.BatchNormalization()(x))
    else:
        x = layers.Conv2D(64, 7, 2, padding="same", use_bias=False)(inputs)
        x = layers.ReLU()(layers.BatchNormalization()(x))
        x = layers.MaxPooling2D(3, 2, padding="same")(x)
    for i, width in enumerate((64, 128, 256, 512)):
        for j in range(2):
            x = _basic_block(x, width, 2 if (j == 0 and i > 0) else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes, dtype="float32")(x), name="resnet18")


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """The model called ``name``: small_cnn, resnet18 or resnet50."""
    if name == "small_cnn":
        return small_cnn(input_shape, num_classes)
    if name == "resnet18":
        return resnet18(input_shape, num_classes)
    if name == "resnet50":
        base = keras.applications.ResNet50(weights=None, include_top=False, input_shape=input_shape, pooling="avg")
        return keras.Model(base.input, layers.Dense(num_classes, dtype="float32")(base.output), name="resnet50")
    raise ValueError(f"model.name {name!r} is not allowed for image-classification; "
                     f"choose one of: {', '.join(MODELS)}")


def pipeline_blocks(model: keras.Model) -> list[keras.Model]:
    """``model`` as ordered sub-models sharing its layers, for pipeline stages: small_cnn's features |
    classifier; ResNet-18's stem, each residual block, then the pooling head; ResNet-50's stem and
    each bottleneck block (``*_out``), then the head."""
    from hvdtrain.tensorflow.pipeline import functional_blocks

    if model.name == "small_cnn":
        cuts = [next(layer for layer in model.layers if isinstance(layer, layers.Flatten))]
    elif model.name == "resnet18":  # the stem's ReLU, then the ReLU after each residual Add
        found = model.layers
        cuts = [next(layer for layer in found if isinstance(layer, layers.ReLU))]
        cuts += [found[i + 1] for i, layer in enumerate(found) if isinstance(layer, layers.Add)]
    elif model.name == "resnet50":
        cuts = [layer for layer in model.layers if layer.name == "pool1_pool" or layer.name.endswith("_out")]
    else:
        raise ValueError(f"no pipeline blocks for {model.name}")
    return functional_blocks(model, cuts)
