"""The TensorFlow side of `hvdtrain bench`: a Keras image model from the recipe's ``bench_model``
hook (image-classification's by default) and one fixed random batch (NHWC), kept on the training
device like Horovod's synthetic benchmark."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hvdtrain.core.task import ArrayDataset, TrainTask
from hvdtrain.tensorflow.optimizers import build_optimizer

DEFAULT_CLASSES = 1000  # ImageNet, as in Horovod's benchmark


def _loss(logits: Any, labels: Any) -> Any:
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def _correct(logits: Any, labels: Any) -> dict[str, Any]:
    return {"correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32))}


def synthetic_task(config: Any, settings: Any) -> TrainTask:
    """A TrainTask whose train and val data are the same fixed random batch (seeded by train.seed)."""
    from hvdtrain.core.registry import get_hook


    classes = config.model.num_classes or DEFAULT_CLASSES
    size, batch = settings.image_size, config.train.batch_size
    rng = np.random.default_rng(config.train.seed)
    data = ArrayDataset(rng.standard_normal((batch, size, size, settings.channels), dtype=np.float32),
                        rng.integers(0, classes, size=batch, dtype=np.int64))
    keras.utils.set_random_seed(config.train.seed)
    model = get_hook(config.recipe, "bench_model")("tensorflow", config.model.name, settings.channels, size, classes)
    return TrainTask(model=model, optimizer=build_optimizer(config.optim), loss_fn=_loss,
                     train_data=data, val_data=data, metric_sums=_correct)


def to_device(adapter: Any, inputs: np.ndarray, targets: np.ndarray) -> tuple[tf.Tensor, tf.Tensor]:
    """The batch as tensors on the default device (copied once, not every step)."""
    return tf.constant(inputs), tf.constant(targets)
