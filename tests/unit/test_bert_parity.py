"""bert-finetune: the torch and TensorFlow models built from the same directory agree before training.

Both are built by the recipe's own loaders (``torch_recipe.load_model``, ``tf_recipe.load_model``)
from one Hugging Face directory, with the classifier head drawn from the same seed, and fed the
same token ids from the one tokenisation path. Tolerances (absolute, float32):

* tiny BERT with ``hidden_act=gelu_pytorch_tanh`` (the GELU keras-hub computes): logits 1e-5,
  last hidden states 1e-4 (measured: 1e-8 and 1e-6);
* the embedded MiniLM (exact ``gelu`` in torch, keras-hub's tanh approximation in TensorFlow):
  logits 5e-4, last hidden states 2e-2 with values up to about 6 (measured: 7e-5 and 5e-3).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from jobs import REPO

sys.path.insert(0, str(REPO / "tests" / "distributed" / "workers"))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("keras_hub")

from bert_tiny_model import make_tiny_bert, movie_sentences  # noqa: E402

from hvdtrain_recipes.bert_finetune import pretrained, tokenized  # noqa: E402

LABELS = ["negative", "positive"]


def _outputs(model_dir, texts, seed=42, pairs=None, zero_segments=False):
    from hvdtrain_recipes.bert_finetune import tf_recipe, torch_recipe

    tokenizer = tokenized.load_tokenizer(model_dir, 64)
    ids, segments = tokenized.encode(tokenizer, texts, pairs)
    if zero_segments:
        segments = [np.zeros_like(s) for s in segments]
    pad = tokenized.pad_id(model_dir)
    torch_inputs = tokenized.pad_batch(ids, segments, pad, 8, 64)
    keras_inputs = tokenized.pad_batch(ids, segments, pad, 8, 64, tokenized.KERAS_HUB_INPUTS, "int32")
    assert np.array_equal(torch_inputs["input_ids"], keras_inputs["token_ids"])

    torch_model = torch_recipe.load_model(model_dir, LABELS, seed).eval()
    with torch.no_grad():
        out = torch_model(**{k: torch.from_numpy(v) for k, v in torch_inputs.items()}, output_hidden_states=True)
    keras_model = tf_recipe.load_model(model_dir, pretrained.read_model_config(model_dir), LABELS, seed)
    keras_logits = np.asarray(keras_model(keras_inputs, training=False))
    keras_hidden = np.asarray(keras_model.backbone(keras_inputs, training=False)["sequence_output"])
    real = torch_inputs["attention_mask"].astype(bool)  # padded positions carry no meaning
    return (out.logits.numpy(), keras_logits, out.hidden_states[-1].numpy()[real], keras_hidden[real])


@pytest.fixture(scope="module")
def sentences():
    train, val = movie_sentences(300, 24)
    return train.texts, val.texts


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, sentences):
    return make_tiny_bert(tmp_path_factory.mktemp("bert") / "tiny", sentences[0], hidden_act="gelu_pytorch_tanh")


def test_tiny_bert_same_logits_in_both_frameworks(tiny_dir, sentences):
    torch_logits, keras_logits, torch_hidden, keras_hidden = _outputs(tiny_dir, sentences[1])
    assert np.abs(torch_logits).max() > 1e-3  # the head is really there, logits are not all zero
    np.testing.assert_allclose(keras_logits, torch_logits, rtol=0, atol=1e-5)
    np.testing.assert_allclose(keras_hidden, torch_hidden, rtol=0, atol=1e-4)


def test_sentence_pairs_same_logits_and_segments_matter(tiny_dir, sentences):
    """Pair inputs: both frameworks take the segment ids (torch ``token_type_ids``, keras-hub
    ``segment_ids``) and agree; zeroing the second segment's ids changes the logits."""
    texts, pairs = sentences[1][:12], sentences[1][12:24]
    torch_logits, keras_logits, _, _ = _outputs(tiny_dir, texts, pairs=pairs)
    np.testing.assert_allclose(keras_logits, torch_logits, rtol=0, atol=1e-5)
    zeroed_torch, zeroed_keras, _, _ = _outputs(tiny_dir, texts, pairs=pairs, zero_segments=True)
    assert np.abs(zeroed_torch - torch_logits).max() > 1e-5 and np.abs(zeroed_keras - keras_logits).max() > 1e-5


def test_embedded_minilm_same_logits_in_both_frameworks(sentences):
    _, texts = sentences
    torch_logits, keras_logits, torch_hidden, keras_hidden = _outputs(pretrained.embedded_model_dir(), texts)
    assert np.abs(torch_hidden).max() > 1.0
    np.testing.assert_allclose(keras_logits, torch_logits, rtol=0, atol=5e-4)
    np.testing.assert_allclose(keras_hidden, torch_hidden, rtol=0, atol=2e-2)


def test_head_depends_on_seed_only():
    a, bias = pretrained.head_weights(16, 3, seed=7)
    assert a.shape == (16, 3) and a.dtype == np.float32 and not bias.any()
    assert np.array_equal(a, pretrained.head_weights(16, 3, seed=7)[0])
    assert not np.array_equal(a, pretrained.head_weights(16, 3, seed=8)[0])


def test_no_weight_decay_on_biases_and_layer_norm(tiny_dir):
    from hvdtrain import load_config
    from hvdtrain.tensorflow import build_optimizer
    from hvdtrain_recipes.bert_finetune import tf_recipe, torch_recipe

    model = torch_recipe.LogitsOnly(torch_recipe.load_model(tiny_dir, LABELS, 0))
    decay, no_decay = torch_recipe.parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert {names[id(p)] for p in no_decay["params"]} == {n for n in names.values()
                                                          if n.endswith("bias") or ".LayerNorm." in n}

    keras_model = tf_recipe.load_model(tiny_dir, pretrained.read_model_config(tiny_dir), LABELS, 0)
    optimizer = build_optimizer(load_config(overrides=["optim.name=adamw", "optim.weight_decay=0.01"]).optim,
                                exclude_from_weight_decay=tf_recipe.NO_DECAY)
    optimizer.build(keras_model.trainable_variables)
    undecayed = {v.path for v in keras_model.trainable_variables if not optimizer._use_weight_decay(v)}
    expected = {v.path for v in keras_model.trainable_variables if v.name in ("bias", "gamma", "beta")}
    assert undecayed == expected and any("layer_norm" in p for p in expected) and len(expected) < len(
        keras_model.trainable_variables)


@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_keras_model_takes_the_checkpoints_dropout(tmp_path, sentences, rate):
    """Both frameworks drop out at the checkpoint's ``hidden_dropout_prob`` (keras-hub's converter
    alone would use 0.1 whatever the checkpoint says)."""
    import keras

    from hvdtrain_recipes.bert_finetune import pretrained, tf_recipe, torch_recipe

    model_dir = make_tiny_bert(tmp_path / "tiny", sentences[0], dropout=rate)
    keras_model = tf_recipe.load_model(model_dir, pretrained.read_model_config(model_dir), LABELS, 0)
    keras_rates = {layer.rate for layer in keras_model._flatten_layers() if isinstance(layer, keras.layers.Dropout)}
    torch_model = torch_recipe.load_model(model_dir, LABELS, 0)
    torch_rates = {m.p for m in torch_model.modules() if type(m).__name__ == "Dropout"}
    assert keras_rates == torch_rates == {rate}
    assert {layer.dropout for layer in keras_model.backbone.transformer_layers} == {rate}
