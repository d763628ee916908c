"""The error of unusable text data and the column check, shared by the text-file reader
(:mod:`hvdtrain_recipes.bert_finetune.text_data`) and the Parquet/Arrow reader (:mod:`hvdtrain_recipes.bert_finetune.table_rows`)."""

from __future__ import annotations

from pathlib import Path


class TextDataError(ValueError):
    """A text file is missing, empty or inconsistent; the message names the file and the problem."""


def check_columns(path: Path, columns: list[str], wanted: list[tuple[str, str]]) -> None:
    """Raise naming the first ``(column, option)`` of ``wanted`` that ``columns`` lacks, and the columns there are."""
    for column, option in wanted:
        if column not in columns:
            raise TextDataError(f"data file {path} has no column {column!r} ({option}); "
                                f"its columns are: {', '.join(map(str, columns)) or 'none'}")
