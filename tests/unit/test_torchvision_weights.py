"""torchvision-layout ResNet weights load into hvdtrain's torch and Keras ResNets alike.

The weights are made here with torch (an hvdtrain ResNet with randomised BatchNorm statistics,
written under torchvision's names), since nothing can be downloaded: the same file must give the
same logits in both frameworks, and any mismatch must stop naming the keys, loading nothing.
"""

from __future__ import annotations

import pickle
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
keras = pytest.importorskip("keras")

from hvdtrain import ConfigError  # noqa: E402
from hvdtrain_recipes.image_classification import keras_models, torch_models  # noqa: E402
from hvdtrain_recipes.image_classification.torchvision_weights import (  # noqa: E402
    load_torchvision_resnet, read_state_dict, save_torchvision_resnet, torch_names)


def torchvision_keys(blocks: list[int], bottleneck: bool) -> set[str]:
    """The keys torchvision's resnetXX().state_dict() has, written out from its definition."""
    bn = [f"{s}" for s in (*("weight", "bias", "running_mean", "running_var", "num_batches_tracked"),)]
    keys = {"conv1.weight", *(f"bn1.{s}" for s in bn), "fc.weight", "fc.bias"}
    convs = 3 if bottleneck else 2
    for i, count in enumerate(blocks, start=1):
        for j in range(count):
            for k in range(1, convs + 1):
                keys |= {f"layer{i}.{j}.conv{k}.weight", *(f"layer{i}.{j}.bn{k}.{s}" for s in bn)}
            if j == 0 and (i > 1 or bottleneck):
                keys |= {f"layer{i}.{j}.downsample.0.weight", *(f"layer{i}.{j}.downsample.1.{s}" for s in bn)}
    return keys


def reference(name: str, size: int, classes: int, seed: int = 0) -> torch.nn.Module:
    """An hvdtrain torch ResNet with non-trivial BatchNorm parameters and statistics."""
    torch.manual_seed(seed)
    model = torch_models.build_model(name, 3, (size, size), classes)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def torch_logits(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.eval()(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).numpy()


@pytest.mark.parametrize("name,blocks,bottleneck", [
    ("resnet18", [2, 2, 2, 2], False), ("resnet34", [3, 4, 6, 3], False),
    ("resnet50", [3, 4, 6, 3], True), ("resnet101", [3, 4, 23, 3], True)])
def test_names_are_torchvisions(name, blocks, bottleneck):
    model = torch_models.build_model(name, 3, (64, 64), 1000)
    assert set(torch_names(model)) == torchvision_keys(blocks, bottleneck)
    keras_model = keras_models.build_model(name, (64, 64, 3), 1000)
    assert {k.rsplit(".", 1)[0] for k in torchvision_keys(blocks, bottleneck)} == set(keras_model.torchvision_layers)


@pytest.mark.parametrize("name,size,suffix", [("resnet18", 64, ".pth"), ("resnet50", 32, ".safetensors")])
def test_same_file_same_logits_in_both_frameworks(tmp_path, name, size, suffix):
    path = tmp_path / f"{name}{suffix}"
    source = reference(name, size, 10)
    save_torchvision_resnet(source, path)
    x = np.random.default_rng(1).normal(size=(3, size, size, 3)).astype(np.float32)

    torch_model = torch_models.build_model(name, 3, (size, size), 10)
    assert load_torchvision_resnet(torch_model, path, "torch") == []
    keras_model = keras_models.build_model(name, (size, size, 3), 10)
    assert load_torchvision_resnet(keras_model, path, "tensorflow") == []

    expected = torch_logits(source, x)
    np.testing.assert_allclose(torch_logits(torch_model, x), expected, rtol=0, atol=1e-6)
    scale = float(np.abs(expected).max())
    keras_logits = np.asarray(keras_model(x, training=False))
    np.testing.assert_allclose(keras_logits, expected, rtol=0, atol=1e-4 * max(1.0, scale))


def test_the_torch_free_reader_reads_what_torch_writes(tmp_path):
    """The TensorFlow side's own .pth reader against torch.load: float32, float16, bfloat16, int64
    scalars, a non-contiguous view, an nn.Parameter, an OrderedDict state dict with _metadata."""
    state = reference("resnet18", 64, 10).state_dict()
    state["half"] = torch.randn(3, 4).half()
    state["bf16"] = torch.randn(5).bfloat16()
    state["view"] = torch.arange(12.0).reshape(3, 4).t()[1:]
    state["param"] = torch.nn.Parameter(torch.randn(2, 2))
    torch.save(state, tmp_path / "mixed.pth")
    by_torch = read_state_dict(tmp_path / "mixed.pth")
    without = read_state_dict(tmp_path / "mixed.pth", "tensorflow")
    assert sorted(by_torch) == sorted(without)
    for key, value in by_torch.items():
        np.testing.assert_array_equal(without[key], value, err_msg=key)
        assert without[key].shape == value.shape, key


def test_keras_model_behind_the_input_wrapper(tmp_path):
    """The recipe wraps the Keras ResNet in its uint8-normalising model; the weights still find it."""
    from hvdtrain.tensorflow.images import normalize_inputs

    path = tmp_path / "r18.pth"
    save_torchvision_resnet(reference("resnet18", 64, 5), path)
    inner = keras_models.build_model("resnet18", (64, 64, 3), 5)
    load_torchvision_resnet(normalize_inputs(inner, (64, 64, 3)), path, "tensorflow")
    np.testing.assert_array_equal(np.asarray(inner.get_layer(inner.torchvision_layers["fc"]).bias),
                                  read_state_dict(path)["fc.bias"])


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_head_with_another_class_count_is_reinitialised(tmp_path, framework):
    path = tmp_path / "imagenet_like.pth"
    save_torchvision_resnet(reference("resnet18", 64, 1000), path)
    state = read_state_dict(path)
    if framework == "torch":
        model = torch_models.build_model("resnet18", 3, (64, 64), 7)
        head_before = model.head[2].weight.detach().clone()
        notes = load_torchvision_resnet(model, path, framework)
        assert torch.equal(model.head[2].weight, head_before)
        np.testing.assert_array_equal(model.stem[0].weight.detach().numpy(), state["conv1.weight"])
    else:
        model = keras_models.build_model("resnet18", (64, 64, 3), 7)
        fc = model.get_layer(model.torchvision_layers["fc"])
        head_before = np.asarray(fc.kernel).copy()
        notes = load_torchvision_resnet(model, path, framework)
        np.testing.assert_array_equal(np.asarray(fc.kernel), head_before)
        conv1 = model.get_layer(model.torchvision_layers["conv1"])
        np.testing.assert_array_equal(np.asarray(conv1.kernel), state["conv1.weight"].transpose(2, 3, 1, 0))
    assert len(notes) == 1 and "1000 classes" in notes[0] and "7" in notes[0]


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_mismatches_stop_naming_the_keys_and_load_nothing(tmp_path, framework):
    r18 = tmp_path / "r18.pth"
    save_torchvision_resnet(reference("resnet18", 64, 10), r18)

    def build(name, size=64):
        if framework == "torch":
            return torch_models.build_model(name, 3, (size, size), 10)
        return keras_models.build_model(name, (size, size, 3), 10)

    def weights(model):
        if framework == "torch":
            return [p.detach().clone().numpy() for p in model.parameters()]
        return [np.asarray(v).copy() for v in model.weights]

    r34 = build("resnet34")
    before = weights(r34)
    with pytest.raises(ConfigError, match=r"missing 80 key\(s\): layer1\.2\.bn1\.bias") as info:
        load_torchvision_resnet(r34, r18, framework)
    assert "r18.pth" in str(info.value) and "nothing was loaded" in str(info.value)
    assert all(np.array_equal(a, b) for a, b in zip(before, weights(r34)))

    with pytest.raises(ConfigError, match=r"r18\.pth \(a resnet18\) does not match the model \(resnet50, .*"
                                          r"missing \d+ key\(s\): layer1\.0\.bn3\.bias.*shape mismatch"):
        load_torchvision_resnet(build("resnet50"), r18, framework)

    with pytest.raises(ConfigError, match=r"conv1\.weight \(64, 3, 7, 7\) vs the model's \(64, 3, 3, 3\)"):
        load_torchvision_resnet(build("resnet18", size=32), r18, framework)  # the small-input stem

    state = {k: torch.from_numpy(v) for k, v in read_state_dict(r18).items() if k != "layer4.1.bn2.running_var"}
    state["extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "edited.pth")
    with pytest.raises(ConfigError, match=r"missing 1 key\(s\): layer4\.1\.bn2\.running_var; "
                                          r"unexpected 1 key\(s\): extra\.weight"):
        load_torchvision_resnet(build("resnet18"), tmp_path / "edited.pth", framework)


class Payload:
    """An object whose unpickling would run code."""

    def __reduce__(self):
        return (print, ("pwned",))


def test_files_that_are_not_weights(tmp_path, capsys):
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"conv1.weight": Payload()}, f)
    model = torch_models.build_model("resnet18", 3, (64, 64), 10)
    with pytest.raises(ConfigError, match="not a weights-only torch state dict"):
        load_torchvision_resnet(model, evil, "torch")
    keras_model = keras_models.build_model("resnet18", (64, 64, 3), 10)
    with pytest.raises(ConfigError, match="not a weights-only torch state dict .not a torch zip file"):
        load_torchvision_resnet(keras_model, evil, "tensorflow")
    zipped = tmp_path / "evil_zip.pth"  # torch's zip layout, with code in its data.pkl
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"conv1.weight": Payload()}, protocol=2))
    with pytest.raises(ConfigError, match=r"names (__builtin__|builtins)\.print, which a weights file has no reason"):
        load_torchvision_resnet(keras_model, zipped, "tensorflow")
    assert "pwned" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"suffix '\.h5'; allowed: \.pth"):
        load_torchvision_resnet(model, _touch(tmp_path / "w.h5"), "torch")
    with pytest.raises(ConfigError, match="is not a file"):
        load_torchvision_resnet(model, tmp_path / "absent.pth", "torch")
    with pytest.raises(ConfigError, match="not a readable .safetensors"):
        load_torchvision_resnet(model, _touch(tmp_path / "w.safetensors", b"junk"), "torch")
    with pytest.raises(ConfigError, match="into hvdtrain's resnet18, resnet34, resnet50 and resnet101, not small_cnn"):
        load_torchvision_resnet(keras_models.build_model("small_cnn", (28, 28, 1), 10), _touch(tmp_path / "x.pth"),
                                "tensorflow")


def _touch(path, data: bytes = b""):
    path.write_bytes(data)
    return path
