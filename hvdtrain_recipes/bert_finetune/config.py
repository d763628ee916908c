"""The bert-finetune recipe's own config section, ``text`` (set with ``--set text.key=value`` or a
file's ``text:`` section; listed by ``hvdtrain recipe bert-finetune --keys``)."""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain import option


@dataclass
class TextConfig:
    """Text files and tokenisation."""

    text_column: str = option("text", "CSV/TSV header, JSONL key or Parquet/Arrow column holding the text")
    label_column: str = option("label", "CSV/TSV header, JSONL key or Parquet/Arrow column holding the label (a "
                               "ClassLabel column gives its class names)")
    max_length: int = option(128, "truncate to this many tokens, special tokens included (batches are padded "
                             "only to their longest sequence)", min=4, max=8192)
    pad_to_multiple: int = option(8, "round each batch's padded length up to a multiple of this (bounds "
                                  "TensorFlow retracing)", min=1, max=512)
    val_path: str | None = option(None, "validation file or Parquet/Arrow table (a folder of splits: its validation "
                                  "split); None: the validation split of a data.path folder of splits, else "
                                  "text.val_fraction of data.path held out", resume="data")
    val_fraction: float = option(0.1, "seeded fraction of data.path held out for validation when text.val_path "
                                 "is not given", min=0.0, max=0.9, min_exclusive=True, resume="data")
    text_pair_column: str | None = option(None, "CSV/TSV header, JSONL key or Parquet/Arrow column holding the "
                                          "second text of sentence-pair tasks (MNLI, QQP); None: single texts")
    bad_rows: str = option("error", "a row with a missing or empty text or label, or a validation label the training data "
                           "does not have: 'skip' it (counted and reported) or stop with an 'error' naming its line",
                           choices=("skip", "error"))
    cache: bool = option(True, "tokenise a data file once into a memory-mapped token cache reused by every rank and "
                         "later runs; false tokenises in memory on every rank")
    cache_dir: str | None = option(None, "token cache directory; None: $HVDTRAIN_CACHE_DIR or ~/.cache/hvdtrain/tokens")
    cache_shared: bool = option(False, "the cache directory is on a filesystem all hosts share: rank 0 builds the cache "
                                "for every host (false: local rank 0 of each host builds it)")
    tokenizer_threads: int | None = option(None, "tokenizer threads per tokenising process; None: the cores this process "
                                           "may use, divided among the local ranks that tokenise at the same time",
                                           min=1, max=1024)

