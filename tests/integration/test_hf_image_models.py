"""Hugging Face image-classification directories as the image recipe's ``--model``, in process:
tiny models whose configs these tests write, saved with ``save_pretrained`` (safetensors) and a
hub-style ``preprocessor_config.json``.

* where keras-hub converts the architecture (ViT, DeiT, Swin, DINOv2), torch and TensorFlow load
  the same weights and the same fresh head and compute the same logits on the same uint8 images;
* CNN checkpoints (ResNet, ConvNeXt) load in torch with the head resized to the classes; the
  TensorFlow side refuses them naming the architecture and the supported ones;
* the checkpoint's preprocessing replaces the recipe's image defaults unless the user set them;
* weights that do not match config.json, or a directory without weights, stop before training
  naming the keys or the file (through the real ``hvdtrain recipe`` command: exit 1, one line, no
  checkpoint written).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys

import numpy as np
import pytest

from envguard import isolate_environ
from jobs import REPO, hvdtrain_cli, run

sys.path.insert(0, str(REPO / "tests" / "distributed" / "workers"))
pytest.importorskip("transformers")
pytest.importorskip("keras_hub")

from hf_image_tiny import color_tree, save_tiny_model  # noqa: E402

from hvdtrain_recipes.image_classification import hf_models  # noqa: E402
from hvdtrain_recipes.image_classification.config import ImageConfig  # noqa: E402

LABELS = ["cat", "dog", "fox"]


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch):
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR",))  # set by torch when transformers loads a model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """model_type -> a saved tiny model directory (made on first use)."""
    root, made = tmp_path_factory.mktemp("hf"), {}

    def get(model_type: str):
        if model_type not in made:
            made[model_type] = save_tiny_model(root / model_type, model_type)
        return made[model_type]
    return get


def _images(channels=3, size=32):
    return np.random.default_rng(1).integers(0, 256, size=(2, size, size, channels), dtype=np.uint8)


@pytest.mark.parametrize("model_type", ["vit", "deit", "swin", "dinov2"])
def test_torch_and_tensorflow_compute_the_same_logits(tiny, model_type):
    import keras
    import torch

    from hvdtrain_recipes.image_classification import hf_keras, hf_torch

    hf = hf_models.resolve(tiny(model_type))
    torch_model = hf_torch.load_model(hf, LABELS, seed=3).eval()
    keras_model = hf_keras.load_model(hf, LABELS, seed=3, input_shape=(32, 32, 3))
    for images in (_images(), _images(channels=1)):  # grayscale data is repeated to RGB in both
        with torch.no_grad():
            expected = torch_model(torch.from_numpy(images)).numpy()
        got = keras.ops.convert_to_numpy(keras_model(images, training=False))
        assert got.shape == expected.shape == (2, 3)
        assert np.abs(expected).max() > 1e-3  # a zero head would make the comparison empty
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    # the head is called `classifier` in both (the adapters find it by that name)
    assert torch_model.model.classifier.out_features == 3
    assert torch_model.model.config.id2label == dict(enumerate(LABELS))
    assert keras_model.get_layer(hf_models.HEAD_NAME).kernel.shape[-1] == 3


@pytest.mark.parametrize("model_type", ["resnet", "convnext"])
def test_cnn_checkpoints_load_in_torch_and_are_refused_by_tensorflow_by_name(tiny, model_type):
    import torch

    from hvdtrain_recipes.image_classification import hf_torch

    hf = hf_models.resolve(tiny(model_type))
    model = hf_torch.load_model(hf, LABELS, seed=0).eval()
    with torch.no_grad():
        assert model(torch.from_numpy(_images(size=40))).shape == (2, 3)  # CNNs take any size
    assert model.model.config.label2id == {"cat": 0, "dog": 1, "fox": 2}
    with pytest.raises(hf_models.HFModelError, match=f"no '{model_type}' image model.*supported: vit, deit, swin, "
                       f"dinov2.*--framework torch"):
        hf_models.check_keras_supported(hf)


def test_checkpoint_preprocessing_replaces_the_defaults_unless_set(tiny):
    vit, convnext = hf_models.resolve(tiny("vit")), hf_models.resolve(tiny("convnext"))
    assert vit.preprocessing == hf_models.Preprocessing(32, None, (0.5,) * 3, (0.5,) * 3)
    assert convnext.preprocessing.crop == 0.875 and convnext.preprocessing.size == 32
    image = ImageConfig()
    assert (hf_models.apply_preprocessing(image, vit).size, hf_models.apply_preprocessing(image, vit).transform) \
        == (32, "pad-crop")  # the checkpoint squashes: validation squashes too
    assert hf_models.apply_preprocessing(image, convnext).transform == "imagenet"  # resize + centre crop
    mine = dataclasses.replace(image, size=48, transform="resize")
    assert hf_models.apply_preprocessing(mine, convnext) == mine
    with pytest.raises(hf_models.HFModelError, match="image.size=48 but the vit model .* takes 32x32"):
        hf_models.check_input_size(vit, 48, "torch")
    hf_models.check_input_size(convnext, 48, "torch")  # CNNs take any size


def test_weights_that_do_not_match_are_named_in_both_frameworks(tiny, tmp_path):
    from hvdtrain_recipes.image_classification import hf_keras, hf_torch

    deeper = tmp_path / "vit-3-layers"  # config.json says 3 layers, the weights have 2
    shutil.copytree(tiny("vit"), deeper)
    config = json.loads((deeper / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    hf = hf_models.resolve(deeper)
    with pytest.raises(hf_models.HFModelError, match=r"16 missing key\(s\): vit\.\S*\b2\."):
        hf_torch.load_model(hf, LABELS, seed=0)
    with pytest.raises(hf_models.HFModelError, match="keras-hub cannot convert the weights in .*vit-3-layers.*vit.encoder.layer.2."):
        hf_keras.load_model(hf, LABELS, seed=0, input_shape=(32, 32, 3))


@pytest.mark.parametrize("problem", ["weights of another model", "no weights"])
def test_cli_stops_before_training_naming_keys_or_file(tiny, tmp_path, problem, monkeypatch):
    monkeypatch.setenv("HVDTRAIN_DATA_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    shutil.copytree(tiny("convnext"), model)
    if problem == "no weights":
        (model / "model.safetensors").unlink()
        needles = [str(model), "has no weights", "model.safetensors"]
    else:  # a ResNet config beside ConvNeXt weights
        shutil.copyfile(tiny("resnet") / "config.json", model / "config.json")
        needles = ["do not match its config.json", "resnet", "missing key(s): resnet.", "unexpected key(s): convnext."]
    out = tmp_path / "out"
    proc = run([hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--model", model,
                "--data", color_tree(tmp_path / "data", per_class=2, val_per_class=1), "--output", out,
                "--epochs", "1", "--set", "image.workers=0"], check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("hvdtrain: error:")]
    assert len(error) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in error[0], error[0]
    assert not (out / "checkpoints").exists() and not (out / "model").exists()


def test_the_export_never_replaces_a_folder_it_did_not_write(tiny, tmp_path):
    from hvdtrain_recipes.image_classification import export

    shutil.copytree(tiny("vit"), tmp_path / "run" / "model")
    with pytest.raises(export.ExportTargetError, match="is the model this run starts from"):
        export.check_target(tmp_path / "run", str(tmp_path / "run" / "model"))  # --model ./model --output .
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    with pytest.raises(export.ExportTargetError, match=f"{tmp_path / 'model'} exists and is not an image model"):
        export.check_target(tmp_path, "small_cnn")
    (tmp_path / "model" / export.RECORD_FILE).write_text(json.dumps({"labels": [], "framework": "torch", "size": 8}))
    export.check_target(tmp_path, "small_cnn")  # an earlier export of this run may be replaced
