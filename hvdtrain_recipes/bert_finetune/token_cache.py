"""The token cache: a text file tokenised once into compact arrays, memory-mapped by every rank and
reused by later runs.

An entry is a folder ``CACHE_DIR/KEY/`` holding raw little-endian arrays (``ids.bin``: the token
ids of every row at their real lengths, ``uint16`` or ``int32``; ``offsets.bin`` int64, rows + 1;
``first.bin`` int32, tokens of each row's first segment; ``labels.bin`` int32 label codes;
``lines.bin`` int64 source line numbers) and ``manifest.json`` (dtypes, counts, label vocabulary,
skipped rows, what the key was made of, build time). It is built in ``KEY.tmp-HOST-PID/`` and
renamed into place, so an entry either exists whole or not at all; an exclusive lock on
``KEY.lock`` keeps two jobs from building the same entry at once. Every array file, the manifest
and the folder are fsynced before the rename (and the cache directory after it), so a crash or a
power loss cannot publish a manifest over arrays still in the page cache; an entry whose arrays do
not match its manifest anyway (another writer, a disk error) is not used: :func:`usable` moves it
out of the way with a warning and it is built again.

``KEY`` is a SHA-256 of: the file's absolute path, size, modification time (ns) and the SHA-256 of
its first and last MiB (for a Parquet/Arrow table: its absolute path or glob, its split, and the
name, size and modification time of every file it reads, JSON files of a ``save_to_disk`` folder
included, so a changed, added or removed shard is a new entry); the SHA-256 of ``tokenizer.json``;
``max_length``; the text, pair and label columns; the ``tokenizers`` version and this format's
version. Hashing the head and tail rather than the whole file keeps a cached start-up constant-time on files of many GB (a full hash of 10 GB takes
longer than the start-up target); size and ``mtime_ns`` change on any ordinary write, the head/tail
hash catches a different file copied over with its timestamp preserved. Edit a file in place
without changing its size or modification time and the cache cannot tell: delete the entry (or the
cache directory) then.

The text is streamed: rows are read and tokenised ``CHUNK_ROWS`` at a time with the batch
encoder, and each chunk's arrays are appended to the files, so memory is bounded by a chunk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import numpy as np

from hvdtrain.core.durable import atomic_write_text, fsync_path
from hvdtrain.data.build_once import build_once, file_lock
from hvdtrain_recipes.bert_finetune import text_data, tokenized

FORMAT_VERSION = 2  # 2: rows with more fields than the header are bad rows (format 1 caches may hold them)
CHUNK_ROWS = 8192
HASH_BYTES = 1 << 20
MANIFEST = "manifest.json"
ARRAYS = {"ids": None, "offsets": np.int64, "first": np.int32, "labels": np.int32, "lines": np.int64}


def default_root() -> Path:
    """``$HVDTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/hvdtrain/tokens`` (``~/.cache/hvdtrain/tokens``)."""
    if os.environ.get("HVDTRAIN_CACHE_DIR"):
        return Path(os.environ["HVDTRAIN_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvdtrain" / "tokens"


def file_identity(path: str | Path, split: str | None = None) -> dict:
    """What identifies a data file's content cheaply: path, size, mtime_ns, SHA-256 of head and tail;
    of a Parquet/Arrow table (its ``split``): path, split, and every file's name, size and mtime_ns."""
    from hvdtrain_recipes.bert_finetune import table_rows

    if table_rows.is_table(path):
        absolute = os.path.abspath(os.path.expanduser(str(path)))
        return {"path": absolute, "split": split, "files": table_rows.open_table(absolute, split).identity()}
    path = Path(path).resolve()
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(HASH_BYTES))
        if stat.st_size > HASH_BYTES:
            f.seek(max(HASH_BYTES, stat.st_size - HASH_BYTES))
            digest.update(f.read(HASH_BYTES))
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "sha256_head_tail": digest.hexdigest()}


def tokenizer_digest(model_dir: str | Path) -> str:
    """SHA-256 of the model directory's ``tokenizer.json``."""
    return hashlib.sha256((Path(model_dir) / tokenized.TOKENIZER_FILE).read_bytes()).hexdigest()


def key_record(path: str | Path, model_dir: str | Path, max_length: int, text_column: str, label_column: str,
               pair_column: str | None, split: str | None = None) -> dict:
    """Everything the cached arrays depend on (``split``: the split of a table folder that holds several)."""
    import tokenizers

    return {"format": FORMAT_VERSION, "file": file_identity(path, split),
            "tokenizer_sha256": tokenizer_digest(model_dir),
            "tokenizers_version": tokenizers.__version__, "max_length": max_length, "text_column": text_column,
            "pair_column": pair_column, "label_column": label_column}


def entry_name(record: dict) -> str:
    """The entry's folder name: the file's stem (a table's, with its split) and a hash of ``record``."""
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:24]
    stem = Path(record["file"]["path"]).stem
    if "files" in record["file"]:  # a table: a glob's wildcards and the split kept out of the folder name's syntax
        stem = re.sub(r"[^\w.-]+", "_", "-".join(filter(None, (stem, record["file"]["split"]))))
    return f"{stem[:40]}-{digest}"


class _Writer:
    """Appends each chunk's arrays to files in ``folder`` (or keeps them in memory when None)."""

    def __init__(self, folder: Path | None, dtype: np.dtype):
        self.folder, self.dtype = folder, dtype
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name in ARRAYS}
        self.files = {name: open(folder / f"{name}.bin", "wb") for name in ARRAYS} if folder else {}
        self.rows, self.tokens = 0, 0
        self.append("offsets", np.zeros(1, np.int64))

    def append(self, name: str, array: np.ndarray) -> None:
        if self.files:
            np.ascontiguousarray(array).tofile(self.files[name])
        else:
            self.parts[name].append(array)

    def add(self, chunk: tokenized.EncodedChunk, labels: list[int], lines: list[int]) -> None:
        """Append one tokenised chunk."""
        self.append("ids", chunk.ids)
        self.append("offsets", self.tokens + np.cumsum(chunk.lengths))
        self.append("first", chunk.first)
        self.append("labels", np.asarray(labels, np.int32))
        self.append("lines", np.asarray(lines, np.int64))
        self.rows += len(labels)
        self.tokens += int(chunk.lengths.sum())

    def close(self, durable: bool = False) -> dict[str, np.ndarray]:
        """Close the files (``durable``: flushed and fsynced first); in memory, the concatenated arrays."""
        for f in self.files.values():
            if durable and not f.closed:
                f.flush()
                os.fsync(f.fileno())
            f.close()
        return {name: np.concatenate(parts) if parts else np.zeros(0, self.dtype)
                for name, parts in self.parts.items()} if not self.files else {}


def tokenize_rows(rows, tokenizer, dtype: np.dtype, pairs: bool, writer: _Writer) -> list[str]:
    """Tokenise ``(line, text, pair, label)`` rows ``CHUNK_ROWS`` at a time into ``writer``; return
    the label vocabulary (labels in order of first appearance)."""
    chunk_rows = CHUNK_ROWS
    vocab: dict[str, int] = {}
    texts, second, labels, lines = [], [], [], []

    def flush():
        writer.add(tokenized.encode_chunk(tokenizer, texts, second if pairs else None, dtype), labels, lines)
        texts.clear(), second.clear(), labels.clear(), lines.clear()

    for line, text, pair, label in rows:
        texts.append(text)
        second.append(pair)
        labels.append(vocab.setdefault(label, len(vocab)))
        lines.append(line)
        if len(texts) >= chunk_rows:
            flush()
    if texts:
        flush()
    return list(vocab)


def _arrays(values: dict[str, np.ndarray], vocab: list[str]) -> tokenized.TokenArrays:
    return tokenized.TokenArrays(values["ids"], values["offsets"], values["first"], values["labels"],
                                 values["lines"], vocab)


def encode_in_memory(data: text_data.LabelledTexts, tokenizer, vocab_size: int) -> tokenized.TokenArrays:
    """:class:`~hvdtrain_recipes.bert_finetune.tokenized.TokenArrays` of rows already in memory (the embedded
    default; line numbers are row positions)."""
    pairs = data.pairs if data.pairs is not None else [None] * len(data)
    rows = ((i, t, p, lab) for i, (t, p, lab) in enumerate(zip(data.texts, pairs, data.labels), 1))
    dtype = tokenized.ids_dtype(vocab_size)
    writer = _Writer(None, dtype)
    vocab = tokenize_rows(rows, tokenizer, dtype, data.pairs is not None, writer)
    return _arrays(writer.close(), vocab)


def _file_rows(path: Path, text, bad: text_data.BadRows, split: str | None = None):
    rows = text_data.stream_rows(path, text.text_column, text.label_column, text.text_pair_column, split)
    return text_data.checked_rows(rows, bad, text.text_column, text.label_column, text.text_pair_column)


def _no_rows(path: Path, written: int, bad: text_data.BadRows) -> None:
    if written == 0:
        raise text_data.TextDataError(f"data file {path} is empty: it holds no rows"
                                      + (f" that can be used ({bad.summary()})" if bad.total else ""))


def encode_file(path: Path, text, tokenizer, vocab_size: int,
                split: str | None = None) -> tuple[tokenized.TokenArrays, text_data.BadRows]:
    """Tokenise a file (a table's ``split``) into memory (``text.cache=false``), streamed like :func:`build`."""
    bad = text_data.bad_rows_for(path, text.bad_rows, split)
    dtype = tokenized.ids_dtype(vocab_size)
    writer = _Writer(None, dtype)
    vocab = tokenize_rows(_file_rows(path, text, bad, split), tokenizer, dtype, text.text_pair_column is not None,
                          writer)
    _no_rows(path, writer.rows, bad)
    return _arrays(writer.close(), vocab), bad


def build(entry: Path, record: dict, text, tokenizer, vocab_size: int) -> bool:
    """Build ``entry`` from the file in ``record`` unless it exists (another process built it
    first); return whether this call built it (:func:`hvdtrain.data.build_once.build_once`: the
    entry is looked at, repaired or cleared only under its lock). ``text`` is the recipe's ``text``
    config section."""
    return build_once(entry.with_name(entry.name + ".lock"), lambda: entry if _usable_locked(entry) else None,
                      lambda: _build(entry, record, text, tokenizer, vocab_size), look_first=False)[1]


def _build(entry: Path, record: dict, text, tokenizer, vocab_size: int) -> None:
    """Tokenize the file in ``record`` into ``entry`` (under the entry's lock): written in a
    temporary folder beside it, renamed into place once its manifest is written and fsynced."""
    path, split = Path(record["file"]["path"]), record["file"].get("split")
    for stale in entry.parent.glob(f"{entry.name}.tmp-*"):  # a killed builder's: builds hold this lock
        shutil.rmtree(stale, ignore_errors=True)
    if entry.exists():  # a folder without its manifest (files deleted by hand): never published whole
        aside = entry.with_name(f"{entry.name}.damaged-{socket.gethostname()}-{os.getpid()}")
        os.rename(entry, aside)
        shutil.rmtree(aside, ignore_errors=True)
    tmp = entry.with_name(f"{entry.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    tmp.mkdir()
    try:
        started = time.time()
        bad = text_data.bad_rows_for(path, text.bad_rows, split)
        dtype = tokenized.ids_dtype(vocab_size)
        writer = _Writer(tmp, dtype)
        durable = False
        try:
            vocab = tokenize_rows(_file_rows(path, text, bad, split), tokenizer, dtype,
                                  text.text_pair_column is not None, writer)
            durable = True
        finally:
            writer.close(durable)  # the arrays reach the disk before a manifest describes them
        _no_rows(path, writer.rows, bad)
        manifest = {"key": record, "rows": writer.rows, "tokens": writer.tokens, "ids_dtype": dtype.str,
                    "label_vocab": vocab, "bad_rows": bad.to_json(), "built_at": started,
                    "build_seconds": round(time.time() - started, 3),
                    "built_by": f"{socket.gethostname()}:{os.getpid()}"}
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1) + "\n")  # fsyncs it and tmp
        os.rename(tmp, entry)  # atomic: readers see the whole entry or none
        fsync_path(entry.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def entry_problem(entry: Path) -> str | None:
    """Why the built entry ``entry`` cannot be used (its manifest unreadable, an array file's size
    not the one its manifest implies, offsets not running from 0 to the token count), or None.
    Cheap: sizes and two offsets, never the whole arrays."""
    try:
        manifest = read_manifest(entry)
        rows, tokens, ids_dtype = int(manifest["rows"]), int(manifest["tokens"]), np.dtype(manifest["ids_dtype"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {MANIFEST} is unreadable ({exc})"
    counts = {"ids": tokens, "offsets": rows + 1}
    for name, dtype in ARRAYS.items():
        file = entry / f"{name}.bin"
        want = counts.get(name, rows) * np.dtype(dtype or ids_dtype).itemsize
        size = file.stat().st_size if file.is_file() else None
        if size != want:
            return (f"{file.name} is missing" if size is None
                    else f"{file.name} holds {size} bytes, its {MANIFEST} says {want}")
    offsets = np.memmap(entry / "offsets.bin", dtype=np.int64, mode="r", shape=(rows + 1,))
    first, last = int(offsets[0]), int(offsets[-1])
    del offsets
    if first != 0 or last != tokens:
        return f"offsets.bin runs from {first} to {last}, its {MANIFEST} says 0 to {tokens}"
    return None


def _usable_locked(entry: Path) -> bool:
    """With the entry's lock held: True if ``entry`` is built and whole; a damaged one is moved out
    of the way (then deleted; a process that mapped it keeps its pages) with a warning."""
    if not (entry / MANIFEST).is_file():
        return False
    problem = entry_problem(entry)
    if problem is None:
        return True
    print(f"bert-finetune: warning: token cache {entry}: {problem} (a crash while it was written?); "
          f"building it again", file=sys.stderr, flush=True)
    aside = entry.with_name(f"{entry.name}.damaged-{socket.gethostname()}-{os.getpid()}")
    os.rename(entry, aside)
    shutil.rmtree(aside, ignore_errors=True)
    return False


def usable(entry: Path) -> bool:
    """True if ``entry`` is built and its arrays match its manifest. A damaged entry is moved out of
    the way with a warning (under the entry's lock) and False returned: the builder builds it again."""
    if not (entry / MANIFEST).is_file():
        return False
    if entry_problem(entry) is None:
        return True
    with file_lock(entry.with_name(entry.name + ".lock")):
        return _usable_locked(entry)


def wait_until_built(entry: Path, poll_seconds: float = 0.5) -> None:
    """Sleep until another process has built ``entry``: blocked on its lock while the builder holds
    it, else polling for the manifest. Waiting in a Horovod collective instead would busy-poll a
    core per waiting rank (measured: 9.5 of 10 CPU-seconds in a Gloo allreduce), taking the cores
    the builder's tokenizer threads need. A builder that fails stops the job (the launcher ends
    every rank), so this does not wait for ever."""
    while not (entry / MANIFEST).is_file():
        with file_lock(entry.with_name(entry.name + ".lock")):
            pass
        if not (entry / MANIFEST).is_file():
            time.sleep(poll_seconds)


def read_manifest(entry: Path) -> dict:
    """The entry's manifest."""
    return json.loads((entry / MANIFEST).read_text())


def open_entry(entry: Path, record: dict, bad_rows: str) -> tuple[tokenized.TokenArrays, text_data.BadRows]:
    """Memory-map a built entry (nothing is copied into memory); its skipped rows as
    :class:`~hvdtrain_recipes.bert_finetune.text_data.BadRows` under policy ``bad_rows``."""
    if not (entry / MANIFEST).is_file():
        raise text_data.TextDataError(f"token cache {entry} is missing after it was built: is text.cache_dir on a "
                                      f"filesystem this host does not see? (set text.cache_shared=false)")
    problem = entry_problem(entry)
    if problem is not None:
        raise text_data.TextDataError(f"token cache {entry} is damaged: {problem}; delete it and start again")
    manifest = read_manifest(entry)
    if manifest["key"] != record:
        raise text_data.TextDataError(f"token cache {entry} was built for other inputs; delete it")
    counts = {"ids": manifest["tokens"], "offsets": manifest["rows"] + 1}
    values = {}
    for name, dtype in ARRAYS.items():
        dtype = np.dtype(dtype or manifest["ids_dtype"])
        count = counts.get(name, manifest["rows"])
        values[name] = (np.memmap(entry / f"{name}.bin", dtype=dtype, mode="r", shape=(count,)) if count
                        else np.zeros(0, dtype))
    bad = text_data.bad_rows_for(record["file"]["path"], bad_rows, record["file"].get("split"))
    bad.update(manifest["bad_rows"])
    return _arrays(values, manifest["label_vocab"]), bad
