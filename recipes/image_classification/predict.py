"""Classify image files with an image-classification export (``RUN_DIR/model``), outside training.

The framework and model come from the export's ``image_model.json``; each file is decoded with the
validation transform training used (the same decoder, size, resize/crop, mean and std), so a
prediction sees what validation saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvdtrain.data.decode import DECODE_ERRORS, decode
from hvdtrain.data.transforms import TransformPolicy, sample_op
from recipes.image_classification.export import EXPORT_DIR, KERAS_FILE, RECORD_FILE, TORCH_FILE

BATCH = 32


class ImageInputError(ValueError):
    """An input file cannot be read as an image; the message names it."""


@dataclass
class Prediction:
    """The most probable label of one image file and its probability."""

    input: str
    label: str
    probability: float


def find_export(run_dir: str | Path) -> Path:
    """The export folder of ``run_dir`` (the run directory or the ``model`` folder itself)."""
    run_dir = Path(run_dir)
    for folder in (run_dir / EXPORT_DIR, run_dir):
        if (folder / RECORD_FILE).is_file():
            return folder
    raise FileNotFoundError(f"{run_dir} holds no exported image model (expected {run_dir / EXPORT_DIR} with "
                            f"{RECORD_FILE}); an image-classification run writes it after its last epoch")


def load_images(paths: list[str], record: dict) -> np.ndarray:
    """uint8 NHWC batch of ``paths`` through the validation transform; ImageInputError names a bad file."""
    policy = TransformPolicy(record["transform"], int(record["size"]), False, val_crop=float(record["val_crop"]))
    images = []
    for path in paths:
        if not Path(path).is_file():
            raise ImageInputError(f"{path}: no such file")
        try:
            images.append(decode(path, policy, lambda w, h: sample_op(policy, w, h, 0, -1, 0, train=False),
                                 bool(record["grayscale"])))
        except DECODE_ERRORS as exc:
            raise ImageInputError(f"{path}: not a readable image ({type(exc).__name__}: {exc})") from None
    return np.stack(images)


def _torch_model(folder: Path, record: dict):
    import torch

    if record["source"] == "huggingface":
        from recipes.image_classification.hf_torch import load_export

        return load_export(folder, record["mean"], record["std"])
    from safetensors.torch import load_file

    from hvdtrain.torch.images import normalize_inputs
    from recipes.image_classification.torch_models import build_model

    size = int(record["size"])
    model = build_model(record["model"], int(record["channels"]), (size, size), len(record["labels"]))
    model.load_state_dict(load_file(str(folder / TORCH_FILE)))
    torch.set_grad_enabled(False)
    return normalize_inputs(model).eval()


def _keras_model(folder: Path):
    import keras

    from hvdtrain.tensorflow.images import NormalizeImages
    import recipes.image_classification.hf_keras  # noqa: F401  (registers its layers)

    try:
        import keras_hub  # noqa: F401  (registers the backbones a Hugging Face export refers to)
    except ImportError:
        pass
    return keras.saving.load_model(folder / KERAS_FILE, compile=False,
                                   custom_objects={"NormalizeImages": NormalizeImages})


def _softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def predict(run_dir: str | Path, files: list[str]) -> list[Prediction]:
    """The label and probability of each image file, from the export in ``run_dir``. Every file is
    read before the model is loaded, so a bad one stops at once, naming it."""
    folder = find_export(run_dir)
    record = json.loads((folder / RECORD_FILE).read_text())
    images = load_images(list(files), record)
    if record["framework"] == "torch":
        import torch

        model = _torch_model(folder, record)
        with torch.no_grad():
            logits = np.concatenate([model(torch.from_numpy(images[i:i + BATCH])).float().numpy()
                                     for i in range(0, len(images), BATCH)])
    else:
        import keras

        model = _keras_model(folder)
        logits = np.concatenate([keras.ops.convert_to_numpy(model(images[i:i + BATCH], training=False))
                                 for i in range(0, len(images), BATCH)])
    probabilities = _softmax(logits)
    best = probabilities.argmax(axis=-1)
    return [Prediction(str(f), record["labels"][k], float(p[k])) for f, k, p in zip(files, best, probabilities)]
