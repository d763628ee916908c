"""The recipes' pipeline blocks, composed in order, compute exactly the un-cut model (one process):
torch small_cnn / ResNet-18 / a tiny BERT with padding, Keras small_cnn / ResNet-18."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from envguard import isolate_environ

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed" / "workers"))

# what TensorFlow's first import sets in os.environ itself (these tests import it in-process)
TENSORFLOW_IMPORT_VARIABLES = ("ENABLE_RUNTIME_UPTIME_TELEMETRY", "HDF5_PLUGIN_PATH", "TF2_BEHAVIOR", "TPU_ML_PLATFORM",
                               "TPU_ML_PLATFORM_VERSION")


def run_blocks(blocks, inputs):
    x = inputs
    for block in blocks:
        x = block(x, inputs) if getattr(block, "needs_inputs", False) else block(x)
    return x


@pytest.mark.parametrize("name", ["small_cnn", "resnet18"])
def test_torch_image_blocks_compose_to_the_model(name):
    torch = pytest.importorskip("torch")
    from hvdtrain_recipes.image_classification.torch_models import build_model, pipeline_blocks

    torch.manual_seed(0)
    model = build_model(name, 1, (28, 28), 10).eval()
    blocks = pipeline_blocks(model)
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(run_blocks(blocks, x), model(x))
    owned = {id(p) for b in blocks for p in b.parameters()}
    assert owned == {id(p) for p in model.parameters()}
    assert len(blocks) == (2 if name == "small_cnn" else 10)


def test_torch_bert_blocks_compose_to_the_model(tmp_path, monkeypatch):
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR",))  # torch sets it when transformers saves the model
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bert_tiny_model import make_tiny_bert, movie_sentences

    from hvdtrain_recipes.bert_finetune import torch_recipe, torch_stages

    train, _ = movie_sentences(200, 10)
    model_dir = make_tiny_bert(tmp_path / "tiny", list(train.texts))
    wrapped = torch_recipe.LogitsOnly(torch_recipe.load_model(model_dir, ["neg", "pos"], 0)).eval()
    blocks = torch_stages.pipeline_blocks(wrapped.model)
    inputs = {"input_ids": torch.tensor([[2, 7, 9, 11, 3, 0, 0], [2, 8, 5, 6, 12, 13, 3]]),
              "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]]),
              "token_type_ids": torch.zeros(2, 7, dtype=torch.long)}
    with torch.no_grad():
        assert torch.allclose(run_blocks(blocks, inputs), wrapped(**inputs), atol=1e-6, rtol=0)
    owned = {id(p) for b in blocks for p in b.parameters()}
    assert owned == {id(p) for p in wrapped.parameters()}
    assert len(blocks) == 1 + wrapped.model.config.num_hidden_layers + 1


@pytest.mark.parametrize("name", ["small_cnn", "resnet18"])
def test_keras_image_blocks_compose_to_the_model(name, monkeypatch):
    isolate_environ(monkeypatch, TENSORFLOW_IMPORT_VARIABLES)
    pytest.importorskip("tensorflow")
    import keras

    from hvdtrain_recipes.image_classification.keras_models import build_model, pipeline_blocks

    keras.utils.set_random_seed(0)
    model = build_model(name, (28, 28, 1), 10)
    blocks = pipeline_blocks(model)
    x = np.random.default_rng(0).random((3, 28, 28, 1)).astype("float32")
    y = x
    for block in blocks:
        y = block(y, training=False)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(model(x, training=False)))
    assert {id(v) for b in blocks for v in b.trainable_variables} == {id(v) for v in model.trainable_variables}


def test_keras_bert_blocks_compose_to_the_model(tmp_path, monkeypatch):
    isolate_environ(monkeypatch, TENSORFLOW_IMPORT_VARIABLES)
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras_hub")
    pytest.importorskip("transformers")
    from bert_tiny_model import make_tiny_bert, movie_sentences

    from hvdtrain_recipes.bert_finetune import pretrained, tf_recipe, tf_stages

    train, _ = movie_sentences(200, 10)
    model_dir = make_tiny_bert(tmp_path / "tiny", list(train.texts))
    model = tf_recipe.load_model(model_dir, pretrained.read_model_config(model_dir), ["neg", "pos"], 0)
    inputs = {"token_ids": np.array([[2, 7, 9, 11, 3, 0, 0], [2, 8, 5, 6, 12, 13, 3]], dtype="int32"),
              "padding_mask": np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]], dtype="int32"),
              "segment_ids": np.zeros((2, 7), dtype="int32")}
    y = inputs
    blocks = tf_stages.pipeline_blocks(model)
    for block in blocks:
        y = block([y, inputs], training=False) if getattr(block, "needs_inputs", False) else block(y, training=False)
    np.testing.assert_allclose(np.asarray(y), np.asarray(model(inputs, training=False)), atol=1e-6, rtol=0)
    assert {id(v) for b in blocks for v in b.trainable_variables} == {id(v) for v in model.trainable_variables}
    assert len(blocks) == 1 + len(model.backbone.transformer_layers) + 1
