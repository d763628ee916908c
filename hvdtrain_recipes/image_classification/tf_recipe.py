"""The image-classification task for TensorFlow / Keras 3."""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

import hvdtrain
from hvdtrain.data.normalize import GRAY_MEAN, GRAY_STD, RGB_MEAN, RGB_STD
from hvdtrain.tensorflow import build_optimizer, low_rank_variables
from hvdtrain.tensorflow.images import normalize_inputs
from hvdtrain_recipes.image_classification import export, hf_models
from hvdtrain_recipes.image_classification.common import class_labels, hf_model, load_image_data, model_name
from hvdtrain_recipes.image_classification.keras_models import build_model, pipeline_blocks


def _loss(logits, labels):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def _correct(logits, labels):
    return {"correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32))}


def own_model(config, train, shape: tuple[int, int, int], num_classes: int, main: bool = True) -> keras.Model:
    """One of the recipe's models; with ``model.pretrained``, torchvision-layout ResNet weights
    loaded into it (hvdtrain_recipes/image_classification/torchvision_weights.py); ``main`` (rank 0) prints
    what the load noted, such as a head re-initialised for the dataset's classes."""
    model = build_model(model_name(config, train), shape, num_classes)
    if config.model.pretrained:
        from hvdtrain_recipes.image_classification.torchvision_weights import load_torchvision_resnet

        for note in load_torchvision_resnet(model, config.model.pretrained, "tensorflow"):
            if main:
                print(f"hvdtrain: {note}", flush=True)
    return model


def build(config: hvdtrain.RunConfig, ctx: hvdtrain.DistContext) -> hvdtrain.TrainTask:
    """Model, optimizer, loss and data for one worker; the adapter wires up Horovod. Batches
    arrive as uint8 NHWC; the model's first layer normalises them on its device."""
    export.check_target(config.output, config.model.name)  # never replace a user's folder
    hf = hf_model(config)
    if hf is not None:
        hf_models.check_keras_supported(hf)  # before any data is read
    train, val, num_classes = load_image_data(config, ctx)
    labels = class_labels(train, num_classes)
    if hf is not None:
        hf_models.check_input_size(hf, train.policy.size, "tensorflow")
    keras.utils.set_random_seed(config.train.seed)  # identical init everywhere; rank 0's weights are broadcast anyway
    shape = (*train.image_size, train.channels)
    if hf is not None:
        from hvdtrain_recipes.image_classification import hf_keras

        model = hf_keras.load_model(hf, labels, config.train.seed, shape)
        blocks = None
        head = lambda: model.get_layer(hf_models.HEAD_NAME).trainable_variables  # noqa: E731  (fine-tuning)
        mean, std = hf.preprocessing.mean, hf.preprocessing.std
    else:
        inner = own_model(config, train, shape, num_classes, main=ctx.is_main)
        model = normalize_inputs(inner, shape)
        blocks = lambda: stage_blocks(inner, shape)  # noqa: E731  (parallel.pipeline_stages > 1)
        head = None  # the adapter finds the output Dense
        mean, std = (GRAY_MEAN, GRAY_STD) if train.channels == 1 else (RGB_MEAN, RGB_STD)
    record = export.make_record(labels=labels, framework="tensorflow", source="huggingface" if hf else "hvdtrain",
                                model=hf.model_type if hf else model_name(config, train), policy=train.policy,
                                channels=train.channels, grayscale=train.channels == 1, mean=mean, std=std)

    def write_model(folder: Path) -> None:
        model.save(folder / export.KERAS_FILE)

    return hvdtrain.TrainTask(
        model=model,
        optimizer=build_optimizer(config.optim, exclude_variables=low_rank_variables(model)),  # none on BN, bias
        loss_fn=_loss,
        train_data=train,
        val_data=val,
        metric_sums=_correct,
        export=(lambda output: export.write_export(output, write_model, record))
        if config.parallel.pipeline_stages <= 1 else None,
        info={"labels": labels},
        pipeline_blocks=blocks,
        head=head,
    )


def stage_blocks(model: keras.Model, shape: tuple[int, int, int]) -> list[keras.Model]:
    """``model``'s pipeline blocks (sharing its layers); the first one takes the uint8 NHWC batch
    itself, since a pipeline stage calls its blocks directly, not the normalising wrapper."""
    blocks = pipeline_blocks(model)
    return [normalize_inputs(blocks[0], shape), *blocks[1:]]
