"""The image-classification run's exported model, ``RUN_DIR/model``, written on rank 0 after the
last epoch; ``hvdtrain predict RUN_DIR IMAGE...`` reads it (:mod:`hvdtrain_recipes.image_classification.predict`).

* torch, Hugging Face model: a ``save_pretrained`` directory (``config.json`` with ``id2label``,
  ``model.safetensors``); torch, the recipe's own model: its state dict as ``model.safetensors``;
* TensorFlow: ``model.keras``, the whole model from uint8 images to logits.

Beside it, ``image_model.json``: the labels, the framework, which model, and the preprocessing
(size, channels, validation resize/crop, mean and std). Written under a temporary name and renamed
into place; only an earlier export is ever replaced (:func:`check_target`, before training).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from hvdtrain.core.durable import publish_folder
from hvdtrain_recipes.model_files import export_errors

EXPORT_DIR = "model"
RECORD_FILE = "image_model.json"
KERAS_FILE = "model.keras"
TORCH_FILE = "model.safetensors"


class ExportTargetError(ValueError):
    """``OUTPUT/model`` is a folder this recipe must not replace."""


def is_export(folder: Path) -> bool:
    """True if ``folder`` holds an image export record."""
    try:
        record = json.loads((Path(folder) / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {"labels", "framework", "size"} <= set(record)


def check_target(output: Path, model_name: str) -> None:
    """Refuse an export target this run would destroy: a folder that is not an earlier export,
    or the model directory the run starts from."""
    target = Path(output) / EXPORT_DIR
    if not target.exists():
        return
    if Path(model_name).expanduser().exists() and target.resolve() == Path(model_name).expanduser().resolve():
        raise ExportTargetError(f"{target} is the model this run starts from (--model {model_name}); the export "
                                f"at the end would replace it: choose another --output (nothing was changed)")
    if not target.is_dir() or not is_export(target):
        raise ExportTargetError(f"{target} exists and is not an image model exported by hvdtrain (no {RECORD_FILE}); "
                                f"the export at the end would replace it: move it or choose another --output "
                                f"(nothing was changed)")


def make_record(*, labels: list[str], framework: str, source: str, model: str, policy, channels: int,
                grayscale: bool, mean, std) -> dict:
    """What predict needs besides the weights: labels, model and the validation preprocessing."""
    return {"labels": labels, "label2id": {name: i for i, name in enumerate(labels)}, "framework": framework,
            "source": source, "model": model, "size": policy.size, "transform": policy.kind,
            "val_crop": policy.val_crop, "channels": channels, "grayscale": grayscale,
            "mean": [float(v) for v in mean], "std": [float(v) for v in std]}


def write_export(output: Path, write_model: Callable[[Path], None], record: dict) -> Path:
    """Write ``output/model``: ``write_model(folder)`` plus ``image_model.json``."""
    check_target(output, "")  # again: the folder may have appeared during training
    target = Path(output) / EXPORT_DIR

    def fill(tmp: Path) -> None:
        write_model(tmp)
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")

    with export_errors(target):  # an earlier export is replaced only by a whole, fsynced one
        publish_folder(target, fill)
    print(f"hvdtrain: exported the trained model to {target} (try: hvdtrain predict {output} IMAGE...)", flush=True)
    return target
