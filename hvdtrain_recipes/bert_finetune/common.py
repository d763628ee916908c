"""Set-up shared by the torch and TensorFlow builders: model directory, data, labels, metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hvdtrain.core.durable import atomic_write_text
from hvdtrain_recipes.bert_finetune import pretrained, text_data, text_sources, tokenized

LABELS_FILE = "labels.json"


@dataclass
class TextTaskData:
    """What both builders need: the resolved model directory, its config, the datasets and labels."""

    model_dir: Path
    model_config: dict
    train: tokenized.TokenizedTexts
    val: tokenized.TokenizedTexts
    labels: list[str]


def label_record(labels: list[str], max_length: int) -> dict:
    """The label mapping saved with the run and with the exported model."""
    return {"labels": labels, "label2id": {name: i for i, name in enumerate(labels)}, "max_length": max_length}


def save_labels(output: Path, record: dict, resume: bool) -> None:
    """Rank 0: write ``labels.json`` into the run; on resume the data must give the same labels."""
    path = Path(output) / LABELS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if resume and path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("labels") != record["labels"]:
            raise text_data.TextDataError(f"cannot resume: {path} has labels {saved.get('labels')}, this data "
                                          f"gives {record['labels']} (nothing was changed)")
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def prepare(config, ctx, names: tuple[str, str, str], dtype: str,
            barrier: Callable[[], None] = text_sources.no_barrier) -> TextTaskData:
    """Resolve the model, tokenise the data (or map the token cache), map labels (written to the
    run on rank 0). ``barrier`` waits for every rank (the framework's collective; needed with
    more than one rank, for the download and the token cache)."""
    model_dir = pretrained.resolve_model_dir(config.model.name, ctx, barrier)
    model_config = pretrained.read_model_config(model_dir)
    pretrained.check_max_length(model_config, config.text.max_length, model_dir)
    train_split, val_split = text_sources.load_splits(config, ctx, model_dir, barrier)
    labels = text_sources.train_label_names(train_split)
    if len(labels) < 2:
        raise text_data.TextDataError(f"the training data has a single label ({labels[0]!r}); "
                                      f"classification needs at least 2")
    if config.model.num_classes is not None and config.model.num_classes != len(labels):
        raise text_data.TextDataError(f"model.num_classes={config.model.num_classes} but the training data has "
                                      f"{len(labels)} labels: {', '.join(labels)}")
    train_rows, train_ids = text_sources.label_ids(train_split, labels)
    val_rows, val_ids = text_sources.label_ids(val_split, labels)
    if len(val_rows) == 0:
        raise text_data.TextDataError(f"no validation rows are left: {val_split.bad.summary()}")
    if ctx.is_main:
        for bad in dict.fromkeys((train_split.bad, val_split.bad)):
            if bad.total:
                print(f"bert-finetune: {bad.summary()}", flush=True)
    pad = tokenized.pad_id(model_dir)
    common = dict(pad=pad, max_length=config.text.max_length, pad_to_multiple=config.text.pad_to_multiple,
                  names=names, dtype=dtype)
    train = tokenized.TokenizedTexts(train_split.arrays, train_rows, train_ids, **common)
    val = tokenized.TokenizedTexts(val_split.arrays, val_rows, val_ids, **common)
    if ctx.is_main:
        save_labels(Path(config.output), label_record(labels, config.text.max_length), config.checkpoint.resume)
    return TextTaskData(model_dir, model_config, train, val, labels)


def scored_classes(num_labels: int) -> list[int]:
    """Classes whose F1 is reported: the second label for binary tasks, every class otherwise (macro F1)."""
    return [1] if num_labels == 2 else list(range(num_labels))


def finalize_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Accuracy and F1 (binary: of the second label; more classes: macro average) from summed counts."""
    classes = sorted(int(k[3:]) for k in sums if k.startswith("tp_"))
    scores = []
    for k in classes:
        tp, fp, fn = sums[f"tp_{k}"], sums[f"fp_{k}"], sums[f"fn_{k}"]
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0)
    return {"accuracy": sums["correct"] / max(1.0, sums["count"]), "f1": sum(scores) / max(1, len(scores))}
