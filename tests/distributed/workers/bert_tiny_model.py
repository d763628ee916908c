"""A tiny BERT (random weights, its own WordPiece tokenizer trained on real sentences) saved as a
Hugging Face directory: the path users take with their own model, small enough for CI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from hvdtrain_recipes.bert_finetune.text_data import embedded_movie_reviews

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def movie_sentences(n_train: int, n_val: int):
    """Real labelled sentences (the embedded movie reviews): train and validation rows."""
    train, val = embedded_movie_reviews(max_train=n_train)
    return train, val.take(range(n_val))


def train_tokenizer(texts: list[str], path: Path, vocab_size: int = 600) -> int:
    """A lower-casing BERT WordPiece tokenizer with [CLS]/[SEP] post-processing, saved to ``path``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator(texts, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.save(str(path))
    return tokenizer.get_vocab_size()


def make_tiny_bert(directory: Path, texts: list[str], hidden_act: str = "gelu_pytorch_tanh", seed: int = 0,
                   dropout: float = 0.1) -> Path:
    """Write ``directory`` with config.json, model.safetensors and tokenizer.json of a 2-layer BERT
    (``dropout``: its hidden and attention dropout)."""
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = train_tokenizer(texts, directory / "tokenizer.json")
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, hidden_act=hidden_act,
                                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    transformers.BertModel(config).save_pretrained(directory)
    return directory


def write_csv(path: Path, rows, text_column: str = "sentence", label_column: str = "sentiment") -> Path:
    """Rows ``(text, label)`` as a CSV file with a header."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([label_column, text_column])
        writer.writerows([(label, text) for text, label in rows])
    return path


def write_jsonl(path: Path, rows, text_column: str = "sentence", label_column: str = "sentiment") -> Path:
    """Rows ``(text, label)`` as JSON Lines."""
    with open(path, "w", encoding="utf-8") as f:
        for text, label in rows:
            f.write(json.dumps({text_column: text, label_column: label}) + "\n")
    return path


def tiny_bert_run_files(root: Path, n_train: int, n_val: int, dropout: float = 0.1) -> dict[str, Path]:
    """A tiny BERT (exact GELU) trained on ``n_train`` movie-review sentences' vocabulary, those
    sentences as a training CSV and ``n_val`` more as a validation JSONL file, under ``root``:
    ``{"model", "train", "val"}``."""
    root = Path(root)
    train, val = movie_sentences(n_train, n_val)
    return {"model": make_tiny_bert(root / "tiny-bert", train.texts, hidden_act="gelu", dropout=dropout),
            "train": write_csv(root / "train.csv", zip(train.texts, train.labels)),
            "val": write_jsonl(root / "val.jsonl", zip(val.texts, val.labels))}
