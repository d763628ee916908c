"""Set-up shared by the torch and TensorFlow builders: model directory, data, labels, metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hvdtrain.core.checkpoint import atomic_write_text
from recipes.bert_finetune import pretrained, text_data, tokenized

LABELS_FILE = "labels.json"


@dataclass
class TextTaskData:
    """What both builders need: the resolved model directory, its config, the datasets and labels."""

    model_dir: Path
    model_config: dict
    train: tokenized.TokenizedTexts
    val: tokenized.TokenizedTexts
    labels: list[str]


def load_texts(config) -> tuple[text_data.LabelledTexts, text_data.LabelledTexts]:
    """Train and validation texts: the embedded split, a second file, or a seeded held-out fraction."""
    text, data, seed = config.text, config.data, config.train.seed
    if data.path is None:
        if text.val_path is not None:
            raise text_data.TextDataError("text.val_path needs a training file too (--data FILE)")
        train, val = text_data.embedded_movie_reviews(data.max_train_samples)
        return train, text_data.cap(val, data.max_val_samples, seed + 1)
    train = text_data.read_labelled_file(data.path, text.text_column, text.label_column)
    if text.val_path is not None:
        val = text_data.read_labelled_file(text.val_path, text.text_column, text.label_column)
    else:
        train, val = text_data.split_fraction(train, text.val_fraction, seed, str(data.path))
    return (text_data.cap(train, data.max_train_samples, seed),
            text_data.cap(val, data.max_val_samples, seed + 1))


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


def prepare(config, ctx, names: tuple[str, str, str], dtype: str) -> TextTaskData:
    """Resolve the model, read and tokenise the data, map labels (written to the run on rank 0)."""
    model_dir = pretrained.resolve_model_dir(config.model.name)
    model_config = pretrained.read_model_config(model_dir)
    pretrained.check_max_length(model_config, config.text.max_length, model_dir)
    train_texts, val_texts = load_texts(config)
    source = str(config.text.val_path or config.data.path or "the embedded validation split")
    labels = text_data.label_names(train_texts.labels)
    if len(labels) < 2:
        raise text_data.TextDataError(f"the training data has a single label ({labels[0]!r}); "
                                      f"classification needs at least 2")
    if config.model.num_classes is not None and config.model.num_classes != len(labels):
        raise text_data.TextDataError(f"model.num_classes={config.model.num_classes} but the training data has "
                                      f"{len(labels)} labels: {', '.join(labels)}")
    train_ids = text_data.encode_labels(train_texts.labels, labels, "the training data")
    val_ids = text_data.encode_labels(val_texts.labels, labels, f"validation data ({source})")
    tokenizer = tokenized.load_tokenizer(model_dir, config.text.max_length)
    pad = tokenized.pad_id(model_dir)
    common = dict(pad=pad, max_length=config.text.max_length, pad_to_multiple=config.text.pad_to_multiple,
                  names=names, dtype=dtype)
    train = tokenized.TokenizedTexts(*tokenized.encode(tokenizer, train_texts.texts), train_ids, **common)
    val = tokenized.TokenizedTexts(*tokenized.encode(tokenizer, val_texts.texts), val_ids, **common)
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
