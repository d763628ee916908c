"""The image recipe's model definitions build and produce one logit per class, in both frameworks."""

import numpy as np
import pytest

SHAPES = [("small_cnn", 1, 28), ("resnet18", 3, 32), ("resnet18", 3, 64), ("resnet50", 3, 32)]


@pytest.mark.parametrize("name,channels,size", SHAPES)
def test_torch_models(name, channels, size):
    import torch

    from recipes.image_classification.torch_models import build_model

    model = build_model(name, channels, (size, size), num_classes=7).eval()
    with torch.no_grad():
        out = model(torch.randn(2, channels, size, size))
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    if name == "resnet50":
        assert 23e6 < sum(p.numel() for p in model.parameters()) < 24.6e6  # ResNet-50 minus the 1000-way head


@pytest.mark.parametrize("name,channels,size", SHAPES)
def test_keras_models(name, channels, size):
    from recipes.image_classification.keras_models import build_model

    model = build_model(name, (size, size, channels), num_classes=7)
    out = np.asarray(model(np.random.default_rng(0).standard_normal((2, size, size, channels)).astype("float32")))
    assert out.shape == (2, 7) and np.isfinite(out).all()


def test_unknown_model_is_named():
    from recipes.image_classification.torch_models import build_model

    with pytest.raises(ValueError, match="'vgg'.*small_cnn, resnet18, resnet50"):
        build_model("vgg", 3, (32, 32), 10)
