"""The image-classification task for TensorFlow / Keras 3."""

from __future__ import annotations

import keras
import tensorflow as tf

import hvdtrain
from hvdtrain.tensorflow import build_optimizer
from recipes.image_classification.common import load_datasets
from recipes.image_classification.keras_models import build_model, pipeline_blocks


def _loss(logits, labels):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def _correct(logits, labels):
    return {"correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32))}


def build(config: hvdtrain.RunConfig, ctx: hvdtrain.DistContext) -> hvdtrain.TrainTask:
    """Model, optimizer, loss and data for one worker; the adapter wires up Horovod."""
    train, val, num_classes = load_datasets(config, ctx, channels_first=False)
    keras.utils.set_random_seed(config.train.seed)  # identical init everywhere; rank 0's weights are broadcast anyway
    model = build_model(config.model.name, (*train.image_size, train.channels), num_classes)
    return hvdtrain.TrainTask(
        model=model,
        optimizer=build_optimizer(config.optim),
        loss_fn=_loss,
        train_data=train,
        val_data=val,
        metric_sums=_correct,
        pipeline_blocks=lambda: pipeline_blocks(model),  # parallel.pipeline_stages > 1
    )
