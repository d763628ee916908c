"""Parquet and Arrow text tables for the bert-finetune recipe: which files a path means, and their
rows streamed in bounded batches (pyarrow; imported only when a table is read).

A path is a table when it is:

* a ``.parquet`` or ``.arrow`` file, or a glob of them (``data/train-*.parquet``), read in sorted order;
* a ``datasets`` ``save_to_disk`` folder (``state.json``, ``dataset_info.json``, Arrow files): its
  files in the order ``state.json`` lists them;
* a ``DatasetDict`` ``save_to_disk`` folder (``dataset_dict.json`` and one such folder per split);
* any other folder: the Parquet and Arrow files under it, grouped into splits by the Hugging Face
  Hub's naming (``data/train-00000-of-00002.parquet`` is split ``train``; ``default/test/0000.parquet``
  split ``test``; ``train.parquet``, ``NAME-test.arrow``: ``train``, ``test``); a folder whose
  files form a single group is one table, whatever its name.

A folder of several splits is read one split at a time (:func:`split_names`, :func:`pick_split`).
A label column that the ``huggingface`` schema metadata (or ``dataset_info.json``) declares a
``ClassLabel`` yields its class names (``-1``, the Hub's "no label", is a missing label); other
values are turned into strings as JSON Lines values are. Rows are numbered from 0 across the
table's files in order; :meth:`Table.where` names the file and the row in it.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from hvdtrain_recipes.bert_finetune.text_errors import TextDataError, check_columns

SUFFIXES = (".parquet", ".arrow")
GLOB_CHARACTERS = "*?["
VALIDATION_SPLITS = ("validation", "val", "valid", "dev", "test")
BATCH_ROWS = 4096  # rows per record batch read: memory is bounded by a batch (and a Parquet page)
STATE, INFO, DICT = "state.json", "dataset_info.json", "dataset_dict.json"
SHARD_NAME = re.compile(r"^(?:.*-)?([A-Za-z][\w.]*?)-\d+-of-\d+$")  # [NAME-]SPLIT-00000-of-00002
SPLIT_NAME = re.compile(r"(?:^|[-_.])(train|validation|valid|val|dev|test)$")  # train.parquet, NAME-test.arrow


def is_table(path: str | Path) -> bool:
    """Whether ``path`` names a table (a Parquet/Arrow file, a folder, or a glob that is not the
    name of an existing file) rather than a text file."""
    path = Path(path)
    if path.suffix.lower() in SUFFIXES or path.is_dir():
        return True
    return any(c in str(path) for c in GLOB_CHARACTERS) and not path.exists()


@dataclass(frozen=True)
class Table:
    """The files of one table (one split), in reading order, and what names it in messages."""

    source: str
    files: tuple[Path, ...]
    meta_files: tuple[Path, ...] = ()
    features: dict | None = None  # dataset_info.json's features (save_to_disk), else each file's own
    _rows: list = field(default_factory=list, compare=False, repr=False)

    def identity(self) -> list[list]:
        """``[name, size, mtime_ns]`` of every file read (and of the dataset's JSON files): a changed,
        added or removed shard changes it."""
        return [[str(path), stat.st_size, stat.st_mtime_ns]
                for path in (*self.files, *self.meta_files) for stat in [path.stat()]]

    def where(self, row: int) -> str:
        """``FILE row K``: where the table's row ``row`` (counted from 0 across its files) is."""
        if not self._rows:  # only for messages: counted from the Parquet footers / Arrow batch headers
            self._rows.extend(_row_count(path) for path in self.files)
        start = 0
        for path, count in zip(self.files, self._rows):
            if row < start + count:
                return f"{path} row {row - start} (from 0)"
            start += count
        return f"{self.source} row {row} (from 0)"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TextDataError(f"{path} is not readable JSON ({exc})") from None


def _saved_dataset(folder: Path, source: str) -> Table:
    """A ``save_to_disk`` folder of one dataset."""
    state = _read_json(folder / STATE)
    names = [entry.get("filename") for entry in state.get("_data_files", []) if isinstance(entry, dict)]
    if not names or not all(isinstance(name, str) for name in names):
        raise TextDataError(f"{folder / STATE} lists no Arrow files (_data_files); is {folder} a datasets save_to_disk "
                         f"folder?")
    files = tuple(folder / name for name in names)
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise TextDataError(f"{source}: {folder / STATE} lists {', '.join(missing)}, which does not exist")
    info = folder / INFO
    features = _read_json(info).get("features") if info.is_file() else None
    meta = tuple(path for path in (folder / STATE, info) if path.is_file())
    return Table(source, files, meta, features if isinstance(features, dict) else None)


def _file_split(path: Path, root: Path) -> tuple[str, str | None]:
    """``(folder, split)`` of a Parquet/Arrow file under ``root`` by the Hub's naming, split None if none."""
    parent = path.parent.relative_to(root).as_posix()
    match = SHARD_NAME.match(path.stem) or SPLIT_NAME.search(path.stem)
    if match:
        return parent, match.group(1)
    return parent, (None if parent == "." else path.parent.name)


def _folder_groups(folder: Path) -> dict[tuple[str, str | None], list[Path]]:
    """The Parquet/Arrow files under ``folder`` (hidden folders left out), grouped by (folder, split)."""
    groups: dict[tuple[str, str | None], list[Path]] = {}
    for directory, subfolders, names in os.walk(folder):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        for name in sorted(names):
            path = Path(directory) / name
            if path.suffix.lower() in SUFFIXES and not name.startswith("."):
                groups.setdefault(_file_split(path, folder), []).append(path)
    return groups


def _folder_splits(folder: Path) -> dict[str, Table] | None:
    """The splits of a folder, or None when it is a single table (or holds no table files)."""
    if (folder / DICT).is_file():
        names = _read_json(folder / DICT).get("splits")
        if not isinstance(names, list) or not names:
            raise TextDataError(f"{folder / DICT} lists no splits")
        return {str(name): _saved_dataset(folder / str(name), f"{folder} (split {name!r})") for name in names}
    if (folder / STATE).is_file():
        return None
    groups = _folder_groups(folder)
    if len(groups) <= 1:
        return None
    by_split: dict[str, list[tuple[str, list[Path]]]] = {}
    for (parent, split), files in groups.items():
        by_split.setdefault(split or "(none)", []).append((parent, files))
    if "(none)" in by_split:
        loose = [str(files[0]) for _, files in by_split["(none)"]]
        named = ", ".join(sorted(set(by_split) - {"(none)"}))
        raise TextDataError(f"{folder} holds Parquet/Arrow files of the splits {named} "
                         f"and files of no split ({', '.join(loose)}); point the path at one split's files "
                         f"with a glob (for example '{folder}/data/train-*.parquet')")
    for split, places in by_split.items():
        if len(places) > 1:
            raise TextDataError(f"{folder} holds several datasets with a {split!r} split (in "
                             f"{', '.join(parent + '/' for parent, _ in places)}); point the path at one of them")
    return {split: Table(f"{folder} (split {split!r})", tuple(places[0][1])) for split, places in by_split.items()}


def split_names(path: str | Path) -> list[str]:
    """The splits of a folder of several (a ``DatasetDict`` folder, a Hub-style Parquet folder); [] otherwise."""
    path = Path(path)
    if not path.is_dir():
        return []
    splits = _folder_splits(path)
    return [] if splits is None else list(splits)


def pick_split(path: str | Path, role: str, option: str, required: bool = True) -> str | None:
    """The split of ``path`` that ``role`` (``train`` or ``validation``) reads: ``train``, or the
    first of :data:`VALIDATION_SPLITS` present. None for a path without splits, or (``required``
    false) without such a split; else an error naming ``option`` and the splits there are."""
    names = split_names(path)
    if not names:
        return None
    wanted = ("train",) if role == "train" else VALIDATION_SPLITS
    for name in wanted:
        if name in names:
            return name
    if not required:
        return None
    raise TextDataError(f"{option}={path} has the splits {', '.join(names)} but no {' / '.join(wanted)} split; "
                     f"point {option} at one split's folder or files (a glob)")


def open_table(path: str | Path, split: str | None = None) -> Table:
    """The table ``path`` names (its ``split`` when it has several)."""
    text = str(path)
    folder = Path(path)
    if folder.is_dir():
        splits = _folder_splits(folder)
        if splits is not None:
            if split is None or split not in splits:
                raise TextDataError(f"{folder} has the splits {', '.join(splits)}"
                                 + (f", not {split!r}" if split is not None else "; name one"))
            return splits[split]
        if split is not None:
            raise TextDataError(f"{folder} has no splits (asked for {split!r})")
        if (folder / STATE).is_file():
            return _saved_dataset(folder, text)
        files = [p for group in _folder_groups(folder).values() for p in group]
        if not files:
            raise TextDataError(f"data folder {folder} holds no Parquet (.parquet) or Arrow (.arrow) files, nor a "
                             f"datasets save_to_disk folder ({STATE}, {DICT})")
        return Table(text, tuple(files))
    if split is not None:
        raise TextDataError(f"{text} has no splits (asked for {split!r})")
    if any(c in text for c in GLOB_CHARACTERS) and not folder.exists():
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(text), recursive=True)
                       if Path(p).is_file() and Path(p).suffix.lower() in SUFFIXES)
        if not files:
            raise TextDataError(f"data path {text} matches no Parquet (.parquet) or Arrow (.arrow) file")
        return Table(text, tuple(files))
    if not folder.is_file():
        raise TextDataError(f"data file {folder} does not exist")
    return Table(text, (folder,))


def _is_arrow_file_format(path: Path) -> bool:
    """Whether an Arrow file is in the IPC file format (``ARROW1`` magic) rather than the stream
    format ``datasets`` writes."""
    with open(path, "rb") as f:
        return f.read(6) == b"ARROW1"


def _arrow_reader(path: Path):
    """A record-batch reader over an Arrow IPC file (stream or file format), read from disk batch
    by batch (not memory-mapped: the memory in use stays one batch)."""
    import pyarrow as pa

    try:
        if _is_arrow_file_format(path):
            reader = pa.ipc.open_file(pa.OSFile(str(path)))
            return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
        reader = pa.ipc.open_stream(pa.OSFile(str(path)))
        return reader.schema, iter(reader)
    except (pa.ArrowInvalid, OSError) as exc:
        raise TextDataError(f"{path} is not a readable Arrow IPC file ({exc})") from None


def _row_count(path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix.lower() == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    with pa.memory_map(str(path)) as source:  # headers only: the batches' buffers are never touched
        reader = pa.ipc.open_file(source) if _is_arrow_file_format(path) else pa.ipc.open_stream(source)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        return sum(batch.num_rows for batch in reader)


def _batches(path: Path, columns: list[str]):
    """``(schema, iterator of record batches of at most BATCH_ROWS rows holding ``columns``)``; the
    iterator is empty when a column is missing (the caller names it from the schema)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix.lower() == ".parquet":
        try:
            parquet = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
        except (pa.ArrowException, OSError) as exc:
            raise TextDataError(f"{path} is not a readable Parquet file ({exc})") from None
        schema = parquet.schema_arrow
        if any(column not in schema.names for column in columns):
            return schema, iter(())
        return schema, parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False)
    schema, batches = _arrow_reader(path)
    if any(column not in schema.names for column in columns):
        return schema, iter(())

    def sliced():
        for batch in batches:
            batch = batch.select(columns)
            for start in range(0, batch.num_rows, BATCH_ROWS):
                yield batch.slice(start, BATCH_ROWS)

    return schema, sliced()


def class_names(schema, features: dict | None, column: str) -> list[str] | None:
    """The class names of ``column`` if the dataset's features (``features``, else the schema's
    ``huggingface`` metadata) declare it a ``ClassLabel``; else None."""
    if features is None and schema.metadata and b"huggingface" in schema.metadata:
        try:
            features = json.loads(schema.metadata[b"huggingface"]).get("info", {}).get("features")
        except (ValueError, AttributeError):
            features = None
    spec = features.get(column) if isinstance(features, dict) else None
    if isinstance(spec, dict) and spec.get("_type") == "ClassLabel" and isinstance(spec.get("names"), list):
        return [str(name) for name in spec["names"]]
    return None


def _strings(values: list) -> list[str | None]:
    return [None if v is None else v if isinstance(v, str) else str(v) for v in values]


def _labels(values: list, names: list[str] | None, column: str) -> tuple[list[str | None], list[str | None]]:
    """``(labels, problems)`` of a batch's label values: class names for a ClassLabel column."""
    if names is None:
        return _strings(values), [None] * len(values)
    labels, problems = [], []
    for value in values:
        if value is None or value == -1:  # -1: the Hub's "no label" (test splits)
            labels.append(None), problems.append(None)
        elif isinstance(value, int) and 0 <= value < len(names):
            labels.append(names[value]), problems.append(None)
        else:
            labels.append(str(value))
            problems.append(f"label {value!r} in column {column!r} is not a class of its ClassLabel "
                            f"({len(names)} names: 0 to {len(names) - 1})")
    return labels, problems


def table_rows(table: Table, wanted: list[tuple[str, str]]):
    """Yield ``(row, text, pair, label, problem)`` for every row of ``table``, as
    :func:`~hvdtrain_recipes.bert_finetune.text_data.stream_rows` does for a text file: read
    :data:`BATCH_ROWS` rows at a time, only the columns used. ``wanted``: ``(column, option)`` of
    the text, the label and (if any) the pair column, which every file must have."""
    import pyarrow as pa

    text_column, label_column = wanted[0][0], wanted[1][0]
    pair_column = wanted[2][0] if len(wanted) > 2 else None
    columns = list(dict.fromkeys(column for column, _ in wanted))
    row = 0
    for path in table.files:
        schema, batches = _batches(path, columns)
        check_columns(path, list(schema.names), wanted)
        names = class_names(schema, table.features, label_column)
        start = row
        try:
            for batch in batches:
                texts = _strings(batch.column(text_column).to_pylist())
                pairs = (_strings(batch.column(pair_column).to_pylist()) if pair_column is not None
                         else [None] * batch.num_rows)
                labels, problems = _labels(batch.column(label_column).to_pylist(), names, label_column)
                for i in range(batch.num_rows):
                    yield row + i, texts[i], pairs[i], labels[i], problems[i]
                row += batch.num_rows
        except (OSError, pa.ArrowException) as exc:  # a truncated or damaged shard, named
            raise TextDataError(f"{path} could not be read after its first {row - start} rows (a truncated or "
                                f"damaged file?): {exc}") from None
