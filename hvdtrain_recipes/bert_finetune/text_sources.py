"""Where each rank's tokenised rows come from: the embedded split (tokenised in memory), or the
training and validation files (or Parquet/Arrow tables; a folder of splits gives its ``train``
split for training and its ``validation``, ``val``, ``valid``, ``dev`` or ``test`` split, if it has
one and ``text.val_path`` is not given, for validation) through the token cache, built by one
process per host (or by rank 0 when ``text.cache_shared``) while the other ranks wait at a
barrier, then memory-mapped by all.

Tokenizer threads: the one building process gets the cores it may use (the other local ranks
are waiting, not computing); when every rank tokenises (``text.cache=false``, the embedded
split) they are divided among the local ranks. ``text.tokenizer_threads`` overrides both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from hvdtrain_recipes.bert_finetune import table_rows, text_data, token_cache, tokenized


@dataclass
class Split:
    """One split: the tokenised rows of its file, the row indices it uses, the file's skipped rows."""

    arrays: tokenized.TokenArrays
    rows: np.ndarray
    bad: text_data.BadRows
    source: str


def no_barrier() -> None:
    """The barrier of a one-process job."""


def _tokenizer(model_dir: Path, config, sharing: int):
    tokenized.limit_threads(tokenized.tokenizer_threads(config.text.tokenizer_threads, sharing))
    tokenizer = tokenized.load_tokenizer(model_dir, config.text.max_length)
    return tokenizer, tokenizer.get_vocab_size()


def is_cache_builder(config, ctx) -> bool:
    """Whether this process builds the token cache: rank 0 on a shared cache directory, else local rank 0."""
    return ctx.rank == 0 if config.text.cache_shared else ctx.local_rank == 0


def load_files(paths: list[Path], config, ctx, model_dir: Path, barrier: Callable[[], None],
               splits: list[str | None] | None = None) -> list[tuple[tokenized.TokenArrays, text_data.BadRows]]:
    """Tokenised rows and skipped rows of each file (of ``splits[i]`` of a table folder holding
    several): memory-mapped from the token cache (built here if this process is the builder; the
    others wait at ``barrier``), or with ``text.cache=false`` tokenised in memory on every rank."""
    text = config.text
    splits = splits or [None] * len(paths)
    if not text.cache:
        tokenizer, vocab_size = _tokenizer(model_dir, config, ctx.local_size)
        return [token_cache.encode_file(path, text, tokenizer, vocab_size, split)
                for path, split in zip(paths, splits)]
    for path in paths:
        if not table_rows.is_table(path) and not path.is_file():
            raise text_data.TextDataError(f"data file {path} does not exist")
    root = Path(text.cache_dir).expanduser() if text.cache_dir else token_cache.default_root()
    records = [token_cache.key_record(path, model_dir, text.max_length, text.text_column, text.label_column,
                                      text.text_pair_column, split) for path, split in zip(paths, splits)]
    entries = [root / token_cache.entry_name(record) for record in records]
    if is_cache_builder(config, ctx):
        tokenizer = vocab_size = None
        for entry, record in zip(entries, records):
            if not token_cache.usable(entry):  # not built, or damaged (moved aside, with a warning)
                if tokenizer is None:
                    tokenizer, vocab_size = _tokenizer(model_dir, config, 1)
                built = token_cache.build(entry, record, text, tokenizer, vocab_size)
                if built and ctx.is_main:
                    manifest = token_cache.read_manifest(entry)
                    print(f"bert-finetune: tokenised {manifest['rows']} rows of {_named(record)} in "
                          f"{manifest['build_seconds']:.1f} s into the token cache {entry}", flush=True)
            elif ctx.is_main:
                print(f"bert-finetune: token cache {entry} reused", flush=True)
    elif not config.text.cache_shared:  # the builder is on this host: sleep on its lock, not in a collective
        for entry in entries:
            token_cache.wait_until_built(entry)
    barrier()  # distributed: every rank continues once the cache is built (immediate for the local waiters)
    return [token_cache.open_entry(entry, record, text.bad_rows) for entry, record in zip(entries, records)]


def _named(record: dict) -> str:
    """A token cache record's data, as messages name it."""
    split = record["file"].get("split")
    return record["file"]["path"] + (f" (split {split!r})" if split else "")


def load_splits(config, ctx, model_dir: Path, barrier: Callable[[], None] = no_barrier) -> tuple[Split, Split]:
    """Training and validation splits: the embedded split, a second file (or a table folder's
    validation split), or a seeded held-out fraction."""
    text, data, seed = config.text, config.data, config.train.seed
    if data.path is None:
        if text.val_path is not None or text.text_pair_column is not None:
            option = "text.val_path" if text.val_path is not None else "text.text_pair_column"
            raise text_data.TextDataError(f"{option} needs a training file too (--data FILE)")
        train, val = text_data.embedded_movie_reviews(data.max_train_samples)
        tokenizer, vocab_size = _tokenizer(model_dir, config, ctx.local_size)
        splits = []
        for part, name, limit, part_seed in ((train, "training", None, seed), (val, "validation",
                                                                             data.max_val_samples, seed + 1)):
            arrays = token_cache.encode_in_memory(part, tokenizer, vocab_size)
            rows = text_data.cap(np.arange(len(arrays)), limit, part_seed)
            source = f"the embedded {name} split"
            splits.append(Split(arrays, rows, text_data.BadRows(source), source))
        return splits[0], splits[1]
    paths, splits = [Path(data.path)], [table_rows.pick_split(data.path, "train", "data.path")]
    if text.val_path is not None:
        paths.append(Path(text.val_path))
        splits.append(table_rows.pick_split(text.val_path, "validation", "text.val_path"))
    elif splits[0] is not None:  # a folder of splits: its own validation split, if it has one
        val_split = table_rows.pick_split(data.path, "validation", "data.path", required=False)
        if val_split is not None:
            paths.append(Path(data.path))
            splits.append(val_split)
    loaded = load_files(paths, config, ctx, model_dir, barrier, splits)
    for _, bad in loaded:
        bad.raise_if_error()
    (train_arrays, train_bad) = loaded[0]
    sources = [_named({"file": {"path": str(path), "split": split}}) for path, split in zip(paths, splits)]
    if len(loaded) > 1:
        val_arrays = loaded[1][0]
        train_rows, val_rows = np.arange(len(train_arrays)), np.arange(len(val_arrays))
        val_path, val_split, val_source = paths[1], splits[1], sources[1]
    else:
        train_rows, val_rows = text_data.split_fraction(len(train_arrays), text.val_fraction, seed, sources[0])
        val_arrays = train_arrays
        val_path, val_split, val_source = paths[0], splits[0], sources[0]
    train = Split(train_arrays, text_data.cap(train_rows, data.max_train_samples, seed), train_bad, sources[0])
    val = Split(val_arrays, text_data.cap(val_rows, data.max_val_samples, seed + 1),
                text_data.bad_rows_for(val_path, text.bad_rows, val_split), val_source)
    return train, val


def label_ids(split: Split, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, label ids)`` of ``split``: rows whose label is not in ``names`` go to ``split.bad``
    (skipped, or an error naming the line)."""
    known = {name: i for i, name in enumerate(names)}
    lookup = np.asarray([known.get(label, -1) for label in split.arrays.label_vocab], dtype=np.int64)
    ids = lookup[np.asarray(split.arrays.labels[split.rows])]
    unknown = np.flatnonzero(ids < 0)
    for position in unknown:
        row = split.rows[position]
        label = split.arrays.label_vocab[split.arrays.labels[row]]
        split.bad.reject(int(split.arrays.lines[row]),
                         f"label {label!r} is not among the training data's labels ({', '.join(names)})")
    if len(unknown):
        keep = ids >= 0
        return split.rows[keep], ids[keep]
    return split.rows, ids


def train_label_names(split: Split) -> list[str]:
    """The distinct labels of the training file in id order (see :func:`text_data.label_names`):
    of all its rows, so a rare label whose rows all fell into the held-out part
    (``text.val_fraction``) or outside ``data.max_train_samples`` still has an id. A pure function
    of the file: every rank that reads the same file gets the same mapping, whatever its hash seed
    (``hvdtrain.core.dataset_check`` proves it before the first step)."""
    present = np.unique(np.asarray(split.arrays.labels))
    return text_data.label_names([split.arrays.label_vocab[code] for code in present])
