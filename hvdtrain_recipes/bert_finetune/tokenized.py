"""One tokenisation path for both frameworks: the model directory's ``tokenizer.json`` through the
``tokenizers`` library, truncation to ``text.max_length``, dynamic padding per batch.

Tokenised rows live in :class:`TokenArrays`: the token ids of all rows concatenated at their real
lengths (``uint16`` when the vocabulary fits, else ``int32``), ``int64`` offsets, the length of each
row's first segment (sentence pairs), label codes and source line numbers. The token cache stores
exactly these arrays on disk and memory-maps them; :class:`TokenizedTexts` is one rank's view (row
indices and label ids) that pads each batch to its longest row.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np

TOKENIZER_FILE = "tokenizer.json"

# Input names each framework's model takes, in the order (token ids, attention mask, segment ids).
TORCH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
KERAS_HUB_INPUTS = ("token_ids", "padding_mask", "segment_ids")


def load_tokenizer(model_dir: str | Path, max_length: int):
    """The fast tokenizer of ``model_dir``, truncating to ``max_length`` tokens, without padding."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"model directory {model_dir} has no tokenizer: {TOKENIZER_FILE} is missing "
                                f"(save one there with `AutoTokenizer.from_pretrained(...).save_pretrained(DIR)` "
                                f"or `tokenizers.Tokenizer.save`)")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    return tokenizer


def pad_id(model_dir: str | Path) -> int:
    """The padding token id the tokenizer file declares ([PAD] or 0 if it declares none)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / TOKENIZER_FILE))
    if tokenizer.padding:
        return int(tokenizer.padding["pad_id"])
    found = tokenizer.token_to_id("[PAD]")
    return 0 if found is None else int(found)


def encode(tokenizer, texts: list[str], pairs: list[str] | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token ids and segment ids of every text, or of every (text, pair) (ragged: no padding)."""
    encodings = tokenizer.encode_batch(list(texts) if pairs is None else list(zip(texts, pairs)))
    return ([np.asarray(e.ids, dtype=np.int32) for e in encodings],
            [np.asarray(e.type_ids, dtype=np.int32) for e in encodings])


def pad_batch(ids: list[np.ndarray], segments: list[np.ndarray], pad: int, multiple: int, limit: int,
              names: tuple[str, str, str] = TORCH_INPUTS, dtype: str = "int64") -> dict[str, np.ndarray]:
    """Right-pad a batch to its longest sequence rounded up to ``multiple`` (never beyond ``limit``)."""
    longest = max(len(x) for x in ids)
    length = max(longest, min(limit, -(-longest // multiple) * multiple))
    token_ids = np.full((len(ids), length), pad, dtype=dtype)
    mask = np.zeros((len(ids), length), dtype=dtype)
    segment_ids = np.zeros((len(ids), length), dtype=dtype)
    for row, (x, s) in enumerate(zip(ids, segments)):
        token_ids[row, :len(x)] = x
        mask[row, :len(x)] = 1
        segment_ids[row, :len(s)] = s
    return dict(zip(names, (token_ids, mask, segment_ids)))


def tokenizer_threads(requested: int | None, sharing: int) -> int:
    """Threads for one tokenising process: ``requested``, else the cores this process may use
    divided among the ``sharing`` processes of this host that tokenise at the same time."""
    if requested:
        return int(requested)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, sharing))


def limit_threads(threads: int) -> None:
    """Bound the tokenizer's thread pool (Rayon) before the first tokenizer of this process runs;
    variables the user exported win."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true" if threads > 1 else "false")


def ids_dtype(vocab_size: int) -> np.dtype:
    """The narrowest dtype of token ids: uint16 up to 65,536 tokens, else int32."""
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.int32)


@dataclass
class EncodedChunk:
    """One chunk of tokenised rows, ready to append to :class:`TokenArrays`' files."""

    ids: np.ndarray      # flat token ids
    lengths: np.ndarray  # int64, tokens per row
    first: np.ndarray    # int32, tokens of each row's first segment (type id 0)


def encode_chunk(tokenizer, texts: list[str], pairs: list[str] | None, dtype: np.dtype) -> EncodedChunk:
    """Tokenise one chunk with the batch encoder (the tokenizer's threads); keep only ids and lengths."""
    batch = texts if pairs is None else list(zip(texts, pairs))
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # fast: no character offsets
    encodings = encode(batch)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=dtype, count=int(lengths.sum()))
    if pairs is None:
        first = lengths.astype(np.int32)
    else:
        first = lengths.astype(np.int32) - np.fromiter((sum(e.type_ids) for e in encodings), dtype=np.int32,
                                                       count=len(encodings))
    return EncodedChunk(ids, lengths, first)


@dataclass
class TokenArrays:
    """Tokenised rows of one file (in memory or memory-mapped from the token cache)."""

    ids: np.ndarray          # flat token ids of all rows, at their real lengths
    offsets: np.ndarray      # int64, rows + 1: row i is ids[offsets[i]:offsets[i + 1]]
    first: np.ndarray        # int32: tokens of each row's first segment; the rest have segment id 1
    labels: np.ndarray       # int32: index of each row's label in ``label_vocab``
    lines: np.ndarray        # int64: line of each row in its file
    label_vocab: list[str]   # the file's distinct labels, in order of first appearance

    def __len__(self) -> int:
        return len(self.labels)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and segment ids of row ``i``."""
        ids = np.asarray(self.ids[self.offsets[i]:self.offsets[i + 1]], dtype=np.int32)
        return ids, (np.arange(len(ids)) >= self.first[i]).astype(np.int32)


def pad_rows(arrays: TokenArrays, rows: np.ndarray, pad: int, multiple: int, limit: int,
             names: tuple[str, str, str] = TORCH_INPUTS, dtype: str = "int64") -> dict[str, np.ndarray]:
    """:func:`pad_batch` for rows of ``arrays``: reads only those rows' tokens from the (memory-mapped) ids."""
    starts, ends = arrays.offsets[rows], arrays.offsets[rows + 1]
    lengths = ends - starts
    longest = int(lengths.max())
    length = max(longest, min(limit, -(-longest // multiple) * multiple))
    token_ids = np.full((len(rows), length), pad, dtype=dtype)
    for row, (start, end) in enumerate(zip(starts, ends)):
        token_ids[row, :end - start] = arrays.ids[start:end]
    position = np.arange(length)
    mask = position < lengths[:, None]
    segment_ids = mask & (position >= arrays.first[rows][:, None])
    return dict(zip(names, (token_ids, mask.astype(dtype), segment_ids.astype(dtype))))


class TokenizedTexts:
    """One split of tokenised rows: indices into :class:`TokenArrays` and their label ids;
    ``get_batch`` returns a dict of padded NumPy arrays and the labels."""

    def __init__(self, arrays: TokenArrays, rows: np.ndarray, labels: np.ndarray, pad: int, max_length: int,
                 pad_to_multiple: int = 8, names: tuple[str, str, str] = TORCH_INPUTS, dtype: str = "int64"):
        self.arrays, self.rows, self.labels = arrays, np.asarray(rows, dtype=np.int64), np.asarray(labels, np.int64)
        self.pad, self.max_length, self.pad_to_multiple = pad, max_length, pad_to_multiple
        self.names, self.dtype = names, dtype

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per row."""
        return np.diff(self.arrays.offsets)[self.rows]

    def fingerprint(self) -> str:
        """SHA-256 of what this split yields: its rows' label ids, lengths, segments and source lines,
        and their tokens (up to 64 MiB of them, else 64 chunks spread over them); equal on every
        rank that read the same file with the same label mapping (hvdtrain.core.dataset_check)."""
        import hashlib

        if getattr(self, "_fingerprint", None):
            return self._fingerprint
        digest = hashlib.sha256()
        for part in (self.rows, self.labels, self.lengths, self.arrays.first[self.rows], self.arrays.lines[self.rows]):
            digest.update(np.ascontiguousarray(part).tobytes())
        ids = self.arrays.ids
        chunk = (1 << 20) // max(1, ids.itemsize)
        starts = range(0, len(ids), chunk) if ids.nbytes <= 64 << 20 else \
            np.linspace(0, len(ids) - chunk, 64).astype(np.int64)
        for start in starts:
            digest.update(np.ascontiguousarray(ids[int(start):int(start) + chunk]).tobytes())
        self._fingerprint = digest.hexdigest()  # the split never changes: once per process
        return self._fingerprint

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Padded inputs and label ids of the rows at ``indices`` (positions in this split)."""
        inputs = pad_rows(self.arrays, self.rows[indices], self.pad, self.pad_to_multiple, self.max_length,
                          self.names, self.dtype)
        return inputs, self.labels[indices]
