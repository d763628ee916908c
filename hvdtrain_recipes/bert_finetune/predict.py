"""Classify text with a bert-finetune export (``RUN_DIR/model``), outside the training loop.

The framework follows from the files: ``model.keras`` is the TensorFlow export, a
``save_pretrained`` directory (``config.json``) the torch one. Tokenisation is the one training
used: the exported ``tokenizer.json``, truncated to the ``max_length`` saved in ``labels.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvdtrain_recipes.bert_finetune import tokenized
from hvdtrain_recipes.bert_finetune.common import LABELS_FILE
from hvdtrain_recipes.bert_finetune.export import EXPORT_DIR, KERAS_FILE
from hvdtrain_recipes.model_files import from_pretrained, load_keras


@dataclass
class Prediction:
    """The most probable label of one text and its probability."""

    text: str
    label: str
    probability: float


def find_export(run_dir: str | Path) -> Path:
    """The export folder of ``run_dir`` (the run directory or the ``model`` folder itself)."""
    run_dir = Path(run_dir)
    for folder in (run_dir / EXPORT_DIR, run_dir):
        if (folder / LABELS_FILE).is_file() and ((folder / KERAS_FILE).is_file() or (folder / "config.json").is_file()):
            return folder
    raise FileNotFoundError(f"{run_dir} holds no exported text model (expected {run_dir / EXPORT_DIR} with "
                            f"{LABELS_FILE} and {KERAS_FILE} or config.json); a bert-finetune run writes it "
                            f"after its last epoch")


def _torch_probabilities(folder: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = from_pretrained(transformers.AutoModelForSequenceClassification, folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits
    return torch.softmax(logits.float(), dim=-1).numpy()


def _keras_probabilities(folder: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    import keras
    import keras_hub  # noqa: F401  (registers the classes model.keras refers to)

    model = load_keras(folder / KERAS_FILE)
    logits = keras.ops.convert_to_numpy(model(inputs, training=False)).astype(np.float64)
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def predict(run_dir: str | Path, texts: list[str]) -> list[Prediction]:
    """The label and probability of each text, from the export in ``run_dir``."""
    folder = find_export(run_dir)
    record = json.loads((folder / LABELS_FILE).read_text())
    tokenizer = tokenized.load_tokenizer(folder, int(record["max_length"]))
    ids, segments = tokenized.encode(tokenizer, texts)
    pad = tokenized.pad_id(folder)
    if (folder / KERAS_FILE).is_file():
        inputs = tokenized.pad_batch(ids, segments, pad, 1, record["max_length"], tokenized.KERAS_HUB_INPUTS, "int32")
        probabilities = _keras_probabilities(folder, inputs)
    else:
        inputs = tokenized.pad_batch(ids, segments, pad, 1, record["max_length"], tokenized.TORCH_INPUTS, "int64")
        probabilities = _torch_probabilities(folder, inputs)
    best = probabilities.argmax(axis=-1)
    return [Prediction(text, record["labels"][k], float(p[k])) for text, k, p in zip(texts, best, probabilities)]
