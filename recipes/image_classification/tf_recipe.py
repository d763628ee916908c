"""The image-classification task for TensorFlow / Keras 3."""

from __future__ import annotations

import keras
import tensorflow as tf

import hvdtrain
from hvdtrain.tensorflow import build_optimizer, low_rank_variables
from hvdtrain.tensorflow.images import normalize_inputs
from recipes.image_classification.common import load_image_data, model_name
from recipes.image_classification.keras_models import build_model, pipeline_blocks


def _loss(logits, labels):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def _correct(logits, labels):
    return {"correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32))}


def build(config: hvdtrain.RunConfig, ctx: hvdtrain.DistContext) -> hvdtrain.TrainTask:
    """Model, optimizer, loss and data for one worker; the adapter wires up Horovod. Batches
    arrive as uint8 NHWC; the model's first layer normalises them on its device."""
    train, val, num_classes = load_image_data(config, ctx)
    keras.utils.set_random_seed(config.train.seed)  # identical init everywhere; rank 0's weights are broadcast anyway
    shape = (*train.image_size, train.channels)
    inner = build_model(model_name(config, train), shape, num_classes)
    model = normalize_inputs(inner, shape)
    return hvdtrain.TrainTask(
        model=model,
        optimizer=build_optimizer(config.optim, exclude_variables=low_rank_variables(model)),  # none on BN, bias
        loss_fn=_loss,
        train_data=train,
        val_data=val,
        metric_sums=_correct,
        pipeline_blocks=lambda: stage_blocks(inner, shape),  # parallel.pipeline_stages > 1
    )


def stage_blocks(model: keras.Model, shape: tuple[int, int, int]) -> list[keras.Model]:
    """``model``'s pipeline blocks (sharing its layers); the first one takes the uint8 NHWC batch
    itself, since a pipeline stage calls its blocks directly, not the normalising wrapper."""
    blocks = pipeline_blocks(model)
    return [normalize_inputs(blocks[0], shape), *blocks[1:]]
