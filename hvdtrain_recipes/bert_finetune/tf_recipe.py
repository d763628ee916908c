"""The bert-finetune task for TensorFlow / Keras 3: ``keras-hub``'s BertTextClassifier loaded from
the same Hugging Face directory as the torch model (transformers 5 has no TensorFlow models).

keras-hub's BERT computes GELU with the tanh approximation (Hugging Face ``gelu_new`` /
``gelu_pytorch_tanh``); for checkpoints trained with exact ``gelu`` that shifts MiniLM's initial
logits by about 1e-3 against torch (tests/unit/test_bert_parity.py states the tolerances).
"""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

import hvdtrain
from hvdtrain.tensorflow import build_optimizer
from hvdtrain_recipes.bert_finetune import common, export, pretrained, tf_stages
from hvdtrain_recipes.bert_finetune.tokenized import KERAS_HUB_INPUTS

NO_DECAY = ["bias", "gamma", "beta"]  # Keras variable names of biases and LayerNorm scales/offsets
GELU_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def check_supported(model_config: dict, model_dir: Path) -> None:
    """keras-hub's BERT covers BERT-architecture checkpoints with GELU and two segment types."""
    problems = []
    if model_config.get("model_type") != "bert":
        problems.append(f"model_type is {model_config.get('model_type')!r} (supported: 'bert')")
    if model_config.get("hidden_act", "gelu") not in GELU_ACTIVATIONS:
        problems.append(f"hidden_act is {model_config.get('hidden_act')!r} (supported: {', '.join(GELU_ACTIVATIONS)})")
    if model_config.get("type_vocab_size", 2) != 2:
        problems.append(f"type_vocab_size is {model_config.get('type_vocab_size')} (supported: 2)")
    if problems:
        raise pretrained.ModelDirError(f"the TensorFlow version cannot load {model_dir}: " + "; ".join(problems)
                                       + "; use --framework torch for this model")


def load_model(model_dir: Path, model_config: dict, labels: list[str], seed: int) -> keras.Model:
    """BertTextClassifier from ``model_dir`` (no preprocessor: it takes token ids) with the same
    fresh head the torch model gets (:func:`hvdtrain_recipes.bert_finetune.pretrained.head_weights`) and the
    checkpoint's dropout (``hidden_dropout_prob``, ``classifier_dropout``) as in torch; keras-hub
    uses one rate for hidden and attention dropout."""
    import keras_hub

    check_supported(model_config, model_dir)
    hidden_dropout = model_config.get("hidden_dropout_prob", 0.1)
    # keras-hub's converter drops the checkpoint's dropout (its backbone defaults to 0.1): pass it on
    backbone = keras_hub.models.BertBackbone.from_preset(str(model_dir), dropout=hidden_dropout)
    classifier_dropout = model_config.get("classifier_dropout")
    model = keras_hub.models.BertTextClassifier(
        backbone=backbone, num_classes=len(labels), preprocessor=None,
        dropout=hidden_dropout if classifier_dropout is None else classifier_dropout)
    head = model.get_layer("logits")
    kernel, bias = pretrained.head_weights(head.kernel.shape[0], len(labels), seed,
                                           model_config.get("initializer_range", 0.02))
    head.set_weights([kernel, bias])
    return model


def loss_fn(logits, labels):
    """Mean cross-entropy in float32."""
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, tf.cast(logits, tf.float32),
                                                                       from_logits=True))


def metric_sums(logits, labels):
    """Correct predictions and, per scored class, true positives, false positives, false negatives."""
    preds = tf.argmax(logits, axis=1, output_type=labels.dtype)
    count = lambda mask: tf.reduce_sum(tf.cast(mask, tf.float32))  # noqa: E731
    sums = {"correct": count(tf.equal(preds, labels))}
    for k in common.scored_classes(int(logits.shape[1])):
        sums[f"tp_{k}"] = count((preds == k) & (labels == k))
        sums[f"fp_{k}"] = count((preds == k) & (labels != k))
        sums[f"fn_{k}"] = count((preds != k) & (labels == k))
    return sums


def barrier() -> None:
    """Wait until every rank arrives (a one-number allreduce)."""
    import horovod.tensorflow as hvd

    hvd.allreduce(tf.zeros([1]), name="bert_finetune.barrier")  # distributed


def build(config: hvdtrain.RunConfig, ctx: hvdtrain.DistContext) -> hvdtrain.TrainTask:
    """Model, optimizer, loss and data for one worker; the adapter wires up Horovod."""
    export.check_target(config.output, config.model.name)  # never replace a user's folder
    data = common.prepare(config, ctx, KERAS_HUB_INPUTS, dtype="int32", barrier=barrier)
    keras.utils.set_random_seed(config.train.seed)  # dropout alike everywhere; rank 0's weights are broadcast
    model = load_model(data.model_dir, data.model_config, data.labels, config.train.seed)

    def export_model(output: Path) -> None:
        export.write_export(output, lambda folder: model.save(folder / export.KERAS_FILE),
                            data.model_dir, data.labels, config.text.max_length)

    return hvdtrain.TrainTask(
        model=model,
        optimizer=build_optimizer(config.optim, exclude_from_weight_decay=NO_DECAY),
        loss_fn=loss_fn,
        train_data=data.train,
        val_data=data.val,
        metric_sums=metric_sums,
        finalize_metrics=common.finalize_metrics,
        export=export_model,
        pipeline_blocks=lambda: tf_stages.pipeline_blocks(model),  # parallel.pipeline_stages > 1
        info={"model_dir": str(data.model_dir), "labels": data.labels},
    )
