"""One tokenisation path for both frameworks: the model directory's ``tokenizer.json`` through the
``tokenizers`` library, truncation to ``text.max_length``, dynamic padding per batch."""

from __future__ import annotations

from dataclasses import dataclass, field
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


def encode(tokenizer, texts: list[str]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token ids and segment ids of every text (ragged: no padding)."""
    encodings = tokenizer.encode_batch(list(texts))
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


@dataclass
class TokenizedTexts:
    """Tokenised texts and label ids; ``get_batch`` returns a dict of padded NumPy arrays and the labels."""

    ids: list[np.ndarray]
    segments: list[np.ndarray]
    labels: np.ndarray
    pad: int
    max_length: int
    pad_to_multiple: int = 8
    names: tuple[str, str, str] = TORCH_INPUTS
    dtype: str = "int64"
    lengths: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.lengths = np.asarray([len(x) for x in self.ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        inputs = pad_batch([self.ids[i] for i in indices], [self.segments[i] for i in indices], self.pad,
                           self.pad_to_multiple, self.max_length, self.names, self.dtype)
        return inputs, self.labels[indices]
