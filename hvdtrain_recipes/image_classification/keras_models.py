"""Keras 3 image models: the same small CNN and ResNet-18/34/50/101 as the torch side.

"The same" means the same config learns the same way in both frameworks: BatchNormalization with
torch's momentum (Keras's ``momentum=0.9`` is torch's ``momentum=0.1``) and epsilon (1e-5);
torch's initialisers (convolutions in the ResNets ``kaiming_normal_(mode="fan_out")``, every other
convolution and dense layer torch's default ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for weight
and bias); strided convolutions padded symmetrically as torch pads them (Keras's ``"same"`` pads
more on the bottom and right); and the torch variant of the ResNet-50 bottleneck (stride on the
3x3 convolution, "ResNet v1.5"). ``keras.applications``' models differ in all of these.

Each ResNet carries ``torchvision_layers``: torchvision's module name of each convolution, batch
normalisation and the final dense layer (``conv1``, ``layer1.0.bn2``, ``fc``, ...) mapped to the
Keras layer's name, which is what :mod:`hvdtrain_recipes.image_classification.torchvision_weights` loads by.
"""

from __future__ import annotations

import math

import keras
from keras import layers

MODELS = ("small_cnn", "resnet18", "resnet34", "resnet50", "resnet101")
BN_MOMENTUM, BN_EPSILON = 0.9, 1e-5  # torch's BatchNorm2d(momentum=0.1, eps=1e-5)


def _torch_default(fan_in: int) -> dict:
    """torch's default init for Conv2d/Linear weight and bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    return {"kernel_initializer": keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform"),
            "bias_initializer": keras.initializers.RandomUniform(-bound, bound)}


def _he_fan_out() -> keras.initializers.Initializer:
    """torch's ``kaiming_normal_(mode="fan_out", nonlinearity="relu")``."""
    return keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")


def _named(layer, names: dict | None, torch_name: str | None):
    """Record ``layer`` under its torchvision module name (when building a ResNet)."""
    if names is not None and torch_name is not None:
        names[torch_name] = layer.name
    return layer


def _bn(x, names: dict | None = None, torch_name: str | None = None):
    return _named(layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON), names, torch_name)(x)


def _conv(x, filters: int, kernel: int, stride: int = 1, names: dict | None = None, torch_name: str | None = None):
    """A bias-free convolution padded as torch's ``padding=kernel // 2``."""
    if stride > 1 and kernel > 1:
        x = layers.ZeroPadding2D(kernel // 2)(x)
        padding = "valid"
    else:
        padding = "same"
    conv = layers.Conv2D(filters, kernel, stride, padding=padding, use_bias=False, kernel_initializer=_he_fan_out())
    return _named(conv, names, torch_name)(x)


def small_cnn(input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """Two 3x3 convolutions, max-pool, dropout, two dense layers (the classic MNIST network)."""
    h, w, c = input_shape
    return keras.Sequential([
        keras.Input(input_shape),
        layers.Conv2D(32, 3, padding="same", activation="relu", **_torch_default(c * 9)),
        layers.Conv2D(64, 3, padding="same", activation="relu", **_torch_default(32 * 9)),
        layers.MaxPooling2D(2), layers.Dropout(0.25), layers.Flatten(),
        layers.Dense(128, activation="relu", **_torch_default(64 * (h // 2) * (w // 2))), layers.Dropout(0.5),
        layers.Dense(num_classes, dtype="float32", **_torch_default(128)),
    ], name="small_cnn")


def _basic_block(x, width: int, stride: int, names: dict | None = None, prefix: str = ""):
    shortcut = x
    y = layers.ReLU()(_bn(_conv(x, width, 3, stride, names, prefix + "conv1"), names, prefix + "bn1"))
    y = _bn(_conv(y, width, 3, 1, names, prefix + "conv2"), names, prefix + "bn2")
    if stride != 1 or x.shape[-1] != width:
        shortcut = _bn(_conv(x, width, 1, stride, names, prefix + "downsample.0"), names, prefix + "downsample.1")
    return layers.ReLU()(layers.Add()([y, shortcut]))


def _bottleneck(x, width: int, stride: int, names: dict | None = None, prefix: str = ""):
    shortcut, out = x, width * 4
    y = layers.ReLU()(_bn(_conv(x, width, 1, 1, names, prefix + "conv1"), names, prefix + "bn1"))
    y = layers.ReLU()(_bn(_conv(y, width, 3, stride, names, prefix + "conv2"), names, prefix + "bn2"))
    y = _bn(_conv(y, out, 1, 1, names, prefix + "conv3"), names, prefix + "bn3")
    if stride != 1 or x.shape[-1] != out:
        shortcut = _bn(_conv(x, out, 1, stride, names, prefix + "downsample.0"), names, prefix + "downsample.1")
    return layers.ReLU()(layers.Add()([y, shortcut]))


def resnet(input_shape: tuple[int, int, int], num_classes: int, block, layer_counts: list[int], name: str):
    """A ResNet as torch_models.ResNet builds it; for images smaller than 64 pixels a 3x3 stem
    without max-pooling. ``model.torchvision_layers`` maps torchvision's module names to its layers'."""
    inputs, names = keras.Input(input_shape), {}
    if min(input_shape[:2]) < 64:
        x = layers.ReLU()(_bn(_conv(inputs, 64, 3, 1, names, "conv1"), names, "bn1"))
    else:
        x = layers.ReLU()(_bn(_conv(inputs, 64, 7, 2, names, "conv1"), names, "bn1"))
        x = layers.MaxPooling2D(3, 2)(layers.ZeroPadding2D(1)(x))  # after ReLU, zero padding acts as -inf
    for i, (width, blocks) in enumerate(zip((64, 128, 256, 512), layer_counts)):
        for j in range(blocks):
            x = block(x, width, 2 if (j == 0 and i > 0) else 1, names, f"layer{i + 1}.{j}.")
    fan_in = x.shape[-1]
    x = layers.GlobalAveragePooling2D()(x)
    fc = _named(layers.Dense(num_classes, dtype="float32", **_torch_default(fan_in)), names, "fc")
    model = keras.Model(inputs, fc(x), name=name)
    model.torchvision_layers = names
    return model


def resnet18(input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """ResNet-18; for images smaller than 64 pixels a 3x3 stem without max-pooling."""
    return resnet(input_shape, num_classes, _basic_block, [2, 2, 2, 2], "resnet18")


RESNETS = {  # name: (block, residual blocks per stage), as torchvision's resnet18 ... resnet101
    "resnet18": (_basic_block, [2, 2, 2, 2]),
    "resnet34": (_basic_block, [3, 4, 6, 3]),
    "resnet50": (_bottleneck, [3, 4, 6, 3]),
    "resnet101": (_bottleneck, [3, 4, 23, 3]),
}


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """The model called ``name``: small_cnn, resnet18, resnet34, resnet50 or resnet101."""
    if name == "small_cnn":
        return small_cnn(input_shape, num_classes)
    if name in RESNETS:
        block, counts = RESNETS[name]
        return resnet(input_shape, num_classes, block, counts, name)
    raise ValueError(f"model.name {name!r} is not allowed for image-classification; "
                     f"choose one of: {', '.join(MODELS)}")


def pipeline_blocks(model: keras.Model) -> list[keras.Model]:
    """``model`` as ordered sub-models sharing its layers, for pipeline stages: small_cnn's features |
    classifier; ResNet-18's stem, each residual block, then the pooling head; ResNet-50's stem and
    each bottleneck block (``*_out``), then the head."""
    from hvdtrain.tensorflow.stage import functional_blocks

    if model.name == "small_cnn":
        cuts = [next(layer for layer in model.layers if isinstance(layer, layers.Flatten))]
    elif model.name in ("resnet18", "resnet34"):  # the stem's ReLU, then the ReLU after each residual Add
        found = model.layers
        cuts = [next(layer for layer in found if isinstance(layer, layers.ReLU))]
        cuts += [found[i + 1] for i, layer in enumerate(found) if isinstance(layer, layers.Add)]
    elif model.name in ("resnet50", "resnet101"):
        cuts = [layer for layer in model.layers if layer.name == "pool1_pool" or layer.name.endswith("_out")]
    else:
        raise ValueError(f"no pipeline blocks for {model.name}")
    return functional_blocks(model, cuts)
