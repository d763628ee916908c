"""The image recipe's model definitions build and produce one logit per class, in both frameworks."""

import numpy as np
import pytest

SHAPES = [("small_cnn", 1, 28), ("resnet18", 3, 32), ("resnet18", 3, 64), ("resnet50", 3, 32)]


@pytest.mark.parametrize("name,channels,size", SHAPES)
def test_torch_models(name, channels, size):
    import torch

    from hvdtrain_recipes.image_classification.torch_models import build_model

    model = build_model(name, channels, (size, size), num_classes=7).eval()
    with torch.no_grad():
        out = model(torch.randn(2, channels, size, size))
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    if name == "resnet50":
        assert 23e6 < sum(p.numel() for p in model.parameters()) < 24.6e6  # ResNet-50 minus the 1000-way head


@pytest.mark.parametrize("name,channels,size", SHAPES)
def test_keras_models(name, channels, size):
    from hvdtrain_recipes.image_classification.keras_models import build_model

    model = build_model(name, (size, size, channels), num_classes=7)
    out = np.asarray(model(np.random.default_rng(0).standard_normal((2, size, size, channels)).astype("float32")))
    assert out.shape == (2, 7) and np.isfinite(out).all()


def test_unknown_model_is_named():
    from hvdtrain_recipes.image_classification.torch_models import build_model

    with pytest.raises(ValueError, match="'vgg'.*small_cnn, resnet18, resnet34, resnet50, resnet101"):
        build_model("vgg", 3, (32, 32), 10)


def _creation_order(layers_of_type):
    """Keras names layers ``conv2d``, ``conv2d_1``, ... in the order they were created."""
    def number(layer):
        tail = layer.name.rsplit("_", 1)
        return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else 0
    return sorted(layers_of_type, key=number)


# issue 10, item 3b: the same architecture in both frameworks, down to padding, BatchNorm epsilon
# and the bottleneck's stride: torch's weights and running statistics copied into the Keras model
# give the same logits.
@pytest.mark.parametrize("name,size", [("resnet18", 32), ("resnet18", 64), ("resnet50", 64)])
def test_keras_resnets_compute_what_the_torch_ones_compute(name, size):
    import keras
    import torch

    from hvdtrain_recipes.image_classification import keras_models, torch_models

    torch.manual_seed(0)
    reference = torch_models.build_model(name, 3, (size, size), num_classes=5)
    modules = [m for m in reference.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.Linear))]
    with torch.no_grad():
        for m in modules:
            if isinstance(m, torch.nn.BatchNorm2d):  # trained-looking statistics, so epsilon and stats matter
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    model = keras_models.build_model(name, (size, size, 3), num_classes=5)
    convs = _creation_order([l for l in model.layers if isinstance(l, keras.layers.Conv2D)])
    norms = _creation_order([l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)])
    denses = _creation_order([l for l in model.layers if isinstance(l, keras.layers.Dense)])
    torch_convs = [m for m in modules if isinstance(m, torch.nn.Conv2d)]
    torch_norms = [m for m in modules if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(convs) == len(torch_convs) and len(norms) == len(torch_norms) and len(denses) == 1
    for layer, m in zip(convs, torch_convs):
        assert not layer.use_bias and tuple(layer.kernel.shape) == tuple(m.weight.permute(2, 3, 1, 0).shape)
        layer.kernel.assign(m.weight.detach().permute(2, 3, 1, 0).numpy())
    for layer, m in zip(norms, torch_norms):
        assert layer.epsilon == m.eps and layer.momentum == 1 - m.momentum
        layer.set_weights([m.weight.detach().numpy(), m.bias.detach().numpy(), m.running_mean.numpy(),
                           m.running_var.numpy()])
    head = reference.head[-1]
    denses[0].set_weights([head.weight.detach().numpy().T, head.bias.detach().numpy()])

    x = np.random.default_rng(1).standard_normal((2, 3, size, size)).astype("float32")
    with torch.no_grad():
        expected = reference.eval()(torch.from_numpy(x)).numpy()
    got = np.asarray(model(x.transpose(0, 2, 3, 1), training=False))
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())
