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
builder has no distributed lines. The data here is the real MNIST set that
``image-classification`` embeds (``--data DIR`` takes any ImageFolder tree).
"""

import hvdtrain

HIDDEN = 128

hvdtrain.define_recipe(
    "mnist-mlp",
    description="example user recipe: a two-layer perceptron on MNIST (examples/my_recipe.py)",
    defaults={"model": {"name": "mlp-128"}, "train": {"epochs": 1, "batch_size": 64},
              "optim": {"name": "sgd", "lr": 0.02, "momentum": 0.9, "warmup_epochs": 0.1}},
)


def _data(config, ctx, channels_first):
    """Train and val datasets (NumPy batches), the number of classes and of input features."""
    from hvdtrain_recipes.image_classification.common import load_datasets

    train, val, num_classes = load_datasets(config, ctx, channels_first=channels_first)
    height, width = train.image_size
    return train, val, num_classes, train.channels * height * width


@hvdtrain.register_recipe("mnist-mlp", framework="torch")
def build_torch(config, ctx):
    """The torch task."""
    import torch
    import torch.nn.functional as F

    from hvdtrain.torch import build_optimizer

    train, val, num_classes, features = _data(config, ctx, channels_first=True)
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

    train, val, num_classes, features = _data(config, ctx, channels_first=False)
    keras.utils.set_random_seed(config.train.seed)
    model = keras.Sequential([keras.Input((*train.image_size, train.channels)), keras.layers.Flatten(),
                              keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(num_classes)])

    def loss_fn(logits, labels):
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))

    def metric_sums(logits, labels):
        return {"correct": tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32))}

    return hvdtrain.TrainTask(model=model, optimizer=build_optimizer(config.optim), loss_fn=loss_fn,
                              train_data=train, val_data=val, metric_sums=metric_sums)
