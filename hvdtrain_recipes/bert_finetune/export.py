"""The exported model folder ``RUN_DIR/model``, written on rank 0 after the last epoch.

torch: a ``save_pretrained`` directory (``config.json`` with ``id2label``, ``model.safetensors``);
TensorFlow: ``model.keras`` (load with ``import keras_hub; keras.saving.load_model(path)``).
Beside it in both cases: the tokenizer files and ``labels.json`` (label names in id order, and
the ``max_length`` used in training). The folder is written under a temporary name and renamed
into place, so a crash never leaves half an export.

Only an earlier export is ever replaced: :func:`check_target` refuses, before training, an
``OUTPUT/model`` that is not one (a user's folder, e.g. the pretrained model of
``--model ./model --output .``) or that is the model this run starts from, and :func:`write_export`
checks again before it moves the old export away.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from hvdtrain.core.durable import publish_folder
from hvdtrain_recipes.bert_finetune.common import LABELS_FILE, label_record
from hvdtrain_recipes.model_files import export_errors

EXPORT_DIR = "model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
KERAS_FILE = "model.keras"


class ExportTargetError(ValueError):
    """``OUTPUT/model`` is a folder this recipe must not replace."""


def is_export(folder: Path) -> bool:
    """True if ``folder`` is an export this recipe wrote: its ``labels.json`` holds the label record."""
    try:
        record = json.loads((Path(folder) / LABELS_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {"labels", "label2id", "max_length"} <= set(record)


def check_target(output: Path, model_dir: Path) -> None:
    """Refuse (ExportTargetError naming the folder) an export target that this run's export would
    destroy: a folder that is not an earlier export, or the model directory the run reads."""
    target = Path(output) / EXPORT_DIR
    if not target.exists():
        return
    if target.resolve() == Path(model_dir).expanduser().resolve():
        raise ExportTargetError(f"{target} is the model this run starts from (--model {model_dir}); the export "
                                f"at the end would replace it: choose another --output (nothing was changed)")
    if not target.is_dir() or not is_export(target):
        raise ExportTargetError(f"{target} exists and is not a model exported by hvdtrain (no {LABELS_FILE} with "
                                f"the labels); the export at the end would replace it: move it or choose another "
                                f"--output (nothing was changed)")


def write_export(output: Path, write_model: Callable[[Path], None], model_dir: Path, labels: list[str],
                 max_length: int) -> Path:
    """Write ``output/model``: ``write_model(folder)`` plus tokenizer files and ``labels.json``, and
    say where it is and how to try it."""
    record = label_record(labels, max_length)
    check_target(output, model_dir)  # again: the folder may have appeared during training
    target = Path(output) / EXPORT_DIR

    def fill(tmp: Path) -> None:
        write_model(tmp)
        for name in TOKENIZER_FILES:
            if (Path(model_dir) / name).is_file():
                shutil.copyfile(Path(model_dir) / name, tmp / name)
        (tmp / LABELS_FILE).write_text(json.dumps(record, indent=1) + "\n")

    with export_errors(target):  # an earlier export of this run (check_target) is replaced only when whole
        publish_folder(target, fill)
    print(f"hvdtrain: exported the fine-tuned model to {target} (try: hvdtrain predict {output} \"some text\")",
          flush=True)
    return target
