"""A user recipe in one file: a two-layer perceptron on MNIST, PyTorch and TensorFlow/Keras 3.

Nothing to install or register by hand: point hvdtrain at the file. On 2 workers::

    horovodrun -np 2 -H localhost:2 hvdtrain recipe examples/my_recipe.py --framework torch --epochs 1
    horovodrun -np 2 -H localhost:2 hvdtrain recipe examples/my_recipe.py --framework tensorflow --epochs 1

From Python or a notebook::

    import hvdtrain
    result = hvdtrain.run("examples/my_recipe.py", framework="torch", np=2, train__epochs=1)

A recipe is a name, config defaults and one builder per framework. A builder gets the resolved
:class:`hvdtrain.RunConfig` and this worker's :class:`hvdtrain.DistContext` and returns a
:class:`hvdtrain.TrainTask`: model, optimizer, loss, data and metric sums. Horovod itself
(broadcast, gradient allreduce, LR scaling, sharding, checkpoints) is the adapter's job, so the
builder has no distributed lines. The data is the real MNIST set shipped with hvdtrain's ``data``
extra (``hvdtrain.load_mnist``: NumPy arrays), held in ``hvdtrain.ArrayDataset``; any map-style
torch ``Dataset`` or Hugging Face ``datasets.Dataset`` works the same way (``hvdtrain.as_source``).
The example imports nothing but the public API (``hvdtrain.*``).
"""

import numpy as np

import hvdtrain

HIDDEN = 128

hvdtrain.define_recipe(
    "mnist-mlp",
    description="example user recipe: a two-layer perceptron on MNIST (examples/my_recipe.py)",
    defaults={"model": {"name": "mlp-128"}, "train": {"epochs": 1, "batch_size": 64},
              "optim": {"name": "sgd", "lr": 0.02, "momentum": 0.9, "warmup_epochs": 0.1}},
)


def _data(config, channels_first):
    """Train and val datasets (normalised float32 images, int64 labels), the number of classes and of
    input features. ``data.max_train_samples``/``max_val_samples`` take a seeded subset."""
    datasets = []
    for split, limit in (("train", config.data.max_train_samples), ("val", config.data.max_val_samples)):
        images, labels = hvdtrain.load_mnist(split, limit=limit, seed=config.train.seed)  # uint8 NHWC
        x = (images.astype(np.float32) / 255.0 - 0.5) / 0.5
        datasets.append(hvdtrain.ArrayDataset(np.ascontiguousarray(x.transpose(0, 3, 1, 2) if channels_first else x),
                                              labels))
    train, val = datasets
    return train, val, 10, int(np.prod(train.inputs.shape[1:]))


@hvdtrain.register_recipe("mnist-mlp", framework="torch")
def build_torch(config, ctx):
    """The torch task."""
    import torch
    import torch.nn.functional as F

    from hvdtrain.torch import build_optimizer

    train, val, num_classes, features = _data(config, channels_first=True)
    torch.manual_seed(config.train.seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(features, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, num_classes))
    return hvdtrain.TrainTask(
        model=model,
        optimizer=build_optimizer(model.parameters(), config.optim),
        loss_fn=F.cross_entropy,
        train_data=train,
        val_data=val,
        metric_sums=lambda logits, labels: {"correct": (logits.argmax(dim=1) == labels).sum()},
    )


@hvdtrain.register_recipe("mnist-mlp", framework="tensorflow")
def build_tensorflow(config, ctx):
    """The TensorFlow / Keras 3 task."""
    import keras
    import tensorflow as tf

    from hvdtrain.tensorflow import build_optimizer

    train, val, num_classes, features = _data(config, channels_first=False)
    keras.utils.set_random_seed(config.train.seed)
    model = keras.Sequential([keras.Input(train.inputs.shape[1:]), keras.layers.Flatten(),
                              keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(num_classes)])

    def loss_fn(logits, labels):
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))

    def metric_sums(logits, labels):
        return {"correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32))}

    return hvdtrain.TrainTask(model=model, optimizer=build_optimizer(config.optim), loss_fn=loss_fn,
                              train_data=train, val_data=val, metric_sums=metric_sums)
