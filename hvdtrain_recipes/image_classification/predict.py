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
from hvdtrain_recipes.image_classification.export import EXPORT_DIR, KERAS_FILE, RECORD_FILE, TORCH_FILE
from hvdtrain_recipes.model_files import ModelFileError, load_keras

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


def _option_range(name: str) -> tuple[int, int]:
    """The (min, max) of ``image.NAME`` (what training accepts)."""
    import dataclasses

    from hvdtrain_recipes.image_classification.config import ImageConfig

    meta = {f.name: f.metadata for f in dataclasses.fields(ImageConfig)}[name]
    return int(meta["min"]), int(meta["max"])


MAX_LABELS = 1_000_000  # classes an export may declare


def read_record(folder: Path) -> dict:
    """``image_model.json`` of the export ``folder``, checked before anything is built from it:
    the size within ``image.size``'s range, 1 or 3 channels, a mean and std per channel, at most
    :data:`MAX_LABELS` labels, a known framework and transform (a crafted ``"size": 100000``
    took all memory). A bad record is one :class:`ModelFileError` naming the file and the key."""
    from hvdtrain.core.config import FRAMEWORKS
    from hvdtrain.data.transforms import POLICIES

    path = folder / RECORD_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{path} is not readable JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(record, dict):
        raise ModelFileError(f"{path} is not a JSON object")
    low, high = _option_range("size")

    def bad(key: str, allowed: str) -> ModelFileError:
        return ModelFileError(f"{path}: {key!r} is {str(record.get(key))[:60]!r}; it must be {allowed}")

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)

    if type(record.get("size")) is not int or not low <= record["size"] <= high:
        raise bad("size", f"an integer in {low}-{high} (image.size's range)")
    if record.get("channels") not in (1, 3) or type(record.get("channels")) is not int:
        raise bad("channels", "1 or 3")
    labels = record.get("labels")
    if not isinstance(labels, list) or not 0 < len(labels) <= MAX_LABELS or not all(isinstance(x, str) for x in labels):
        raise bad("labels", f"a list of 1 to {MAX_LABELS:,} class names")
    if record.get("framework") not in FRAMEWORKS:
        raise bad("framework", " or ".join(FRAMEWORKS))
    if record.get("transform") not in POLICIES:
        raise bad("transform", "one of " + ", ".join(POLICIES))
    if not number(record.get("val_crop")) or not 0 < record["val_crop"] <= 1:
        raise bad("val_crop", "a number in (0, 1]")
    for key in ("mean", "std"):
        values = record.get(key)
        if not isinstance(values, list) or len(values) not in (1, 3) or not all(number(v) for v in values):
            raise bad(key, "1 or 3 finite numbers")
    if not isinstance(record.get("model"), str) or not isinstance(record.get("source"), str):
        raise bad("model", "a model name (with its 'source')")
    return record


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
        from hvdtrain_recipes.image_classification.hf_torch import load_export

        return load_export(folder, record["mean"], record["std"])
    from safetensors.torch import load_file

    from hvdtrain.torch.images import normalize_inputs
    from hvdtrain_recipes.image_classification.torch_models import build_model

    size = int(record["size"])
    model = build_model(record["model"], int(record["channels"]), (size, size), len(record["labels"]))
    try:
        model.load_state_dict(load_file(str(folder / TORCH_FILE)))
    except Exception as exc:  # SafetensorError (not a safetensors file), RuntimeError (keys or shapes differ)
        raise ModelFileError(f"{folder / TORCH_FILE} is not the weights of the {record['model']} {RECORD_FILE} "
                             f"describes ({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]})"
                             ) from None
    torch.set_grad_enabled(False)
    return normalize_inputs(model).eval()


def _keras_model(folder: Path):
    from hvdtrain.tensorflow.images import NormalizeImages
    import hvdtrain_recipes.image_classification.hf_keras  # noqa: F401  (registers its layers)

    try:
        import keras_hub  # noqa: F401  (registers the backbones a Hugging Face export refers to)
    except ImportError:
        pass
    return load_keras(folder / KERAS_FILE, custom_objects={"NormalizeImages": NormalizeImages})


def _softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def predict(run_dir: str | Path, files: list[str]) -> list[Prediction]:
    """The label and probability of each image file, from the export in ``run_dir``. Every file is
    read before the model is loaded, so a bad one stops at once, naming it."""
    folder = find_export(run_dir)
    record = read_record(folder)
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
