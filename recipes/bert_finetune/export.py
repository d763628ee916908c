"""The exported model folder ``RUN_DIR/model``, written on rank 0 after the last epoch.

torch: a ``save_pretrained`` directory (``config.json`` with ``id2label``, ``model.safetensors``);
TensorFlow: ``model.keras`` (load with ``import keras_hub; keras.saving.load_model(path)``).
Beside it in both cases: the tokenizer files and ``labels.json`` (label names in id order, and
the ``max_length`` used in training). The folder is written under a temporary name and renamed
into place, so a crash never leaves half an export.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from recipes.bert_finetune.common import LABELS_FILE, label_record

EXPORT_DIR = "model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
KERAS_FILE = "model.keras"


def write_export(output: Path, write_model: Callable[[Path], None], model_dir: Path, labels: list[str],
                 max_length: int) -> Path:
    """Write ``output/model``: ``write_model(folder)`` plus tokenizer files and ``labels.json``, and
    say where it is and how to try it."""
    record = label_record(labels, max_length)
    target = Path(output) / EXPORT_DIR
    tmp = Path(output) / f".tmp-{EXPORT_DIR}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_model(tmp)
    for name in TOKENIZER_FILES:
        if (Path(model_dir) / name).is_file():
            shutil.copyfile(Path(model_dir) / name, tmp / name)
    (tmp / LABELS_FILE).write_text(json.dumps(record, indent=1) + "\n")
    if target.exists():
        shutil.rmtree(target)
    os.rename(tmp, target)
    print(f"hvdtrain: exported the fine-tuned model to {target} (try: hvdtrain predict {output} \"some text\")",
          flush=True)
    return target
