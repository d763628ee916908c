"""The bert-finetune recipe's own config section, ``text`` (set with ``--set text.key=value`` or a
file's ``text:`` section; listed by ``hvdtrain recipe bert-finetune --keys``)."""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain import option


@dataclass
class TextConfig:
    """Text files and tokenisation."""

    text_column: str = option("text", "CSV/TSV header or JSONL key holding the text")
    label_column: str = option("label", "CSV/TSV header or JSONL key holding the label")
    max_length: int = option(128, "truncate to this many tokens, special tokens included (batches are padded "
                             "only to their longest sequence)", min=4, max=8192)
    pad_to_multiple: int = option(8, "round each batch's padded length up to a multiple of this (bounds "
                                  "TensorFlow retracing)", min=1, max=512)
    val_path: str | None = option(None, "validation file; None holds out text.val_fraction of data.path")
    val_fraction: float = option(0.1, "seeded fraction of data.path held out for validation when text.val_path "
                                 "is not given", min=0.0, max=0.9, min_exclusive=True)
