"""bert-finetune on a Parquet dataset laid out as the Hugging Face Hub stores it, under real
`horovodrun -np 2 -H localhost:2 --gloo` (torch, the tiny BERT of test_bert_finetune.py): ``data.path``
is the folder, whose ``train`` split (two shards, a ClassLabel label column) trains and whose
``validation`` split validates; the token cache is built once per split by the host's builder and
read by both ranks, the labels are the ClassLabel's names, and both ranks end with identical
parameters that training moved."""

from __future__ import annotations

import json
import sys

import pytest

from envguard import isolate_environ
from jobs import REPO, horovodrun

WORKERS = REPO / "tests" / "distributed" / "workers"
sys.path.insert(0, str(WORKERS))

datasets = pytest.importorskip("datasets")
pytest.importorskip("transformers")

from bert_tiny_model import make_tiny_bert, movie_sentences  # noqa: E402

NAMES = ["negative", "positive"]


def parquet_folder(root, train, val):
    """data/train-0000K-of-00002.parquet and data/validation-00000-of-00001.parquet, as `datasets` writes them."""
    features = datasets.Features({"sentence": datasets.Value("string"), "sentiment": datasets.ClassLabel(names=NAMES)})

    def table(part):
        return datasets.Dataset.from_dict({"sentence": part.texts,
                                           "sentiment": [NAMES.index(label) for label in part.labels]},
                                          features=features)

    (root / "data").mkdir(parents=True)
    for k in range(2):
        table(train).shard(2, k, contiguous=True).to_parquet(root / f"data/train-{k:05d}-of-00002.parquet")
    table(val).to_parquet(root / "data/validation-00000-of-00001.parquet")
    return root


@pytest.mark.distributed
def test_tiny_bert_on_a_hub_parquet_folder_two_ranks(tmp_path, monkeypatch):
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR",))  # set by torch when transformers saves a model
    datasets.disable_progress_bars()
    train, val = movie_sentences(160, 48)
    model = make_tiny_bert(tmp_path / "tiny-bert", train.texts, hidden_act="gelu")
    folder = parquet_folder(tmp_path / "reviews", train, val)
    out, cache, report_path = tmp_path / "run", tmp_path / "tokens", tmp_path / "report.json"
    settings = {"model.name": model, "data.path": folder, "text.text_column": "sentence",
                "text.label_column": "sentiment", "text.max_length": 32, "text.cache_dir": cache,
                "train.batch_size": 8, "optim.lr": 1e-3, "train.epochs": 1, "output": out, "train.log_every": 0,
                "train.progress_bar": False, "train.tensorboard": False}
    proc = horovodrun(["python", WORKERS / "bert_ranks.py", report_path, "torch",
                       *[f"{k}={v}" for k, v in settings.items()]], timeout=300)
    report = json.loads(report_path.read_text())
    assert report["world_size"] == 2
    assert report["moved"] > 1e-4, "training did not change the parameters: the spread check proves nothing"
    assert report["spread"] == 0.0
    assert 0.0 <= report["history"][0]["val_accuracy"] <= 1.0
    for split, rows in (("train", 160), ("validation", 48)):  # built once, by one process, per split
        assert proc.stdout.count(f"tokenised {rows} rows of {folder} (split {split!r})") == 1, proc.stdout
    assert len([entry for entry in cache.iterdir() if entry.is_dir()]) == 2
    assert json.loads((out / "labels.json").read_text())["labels"] == NAMES  # the ClassLabel's names
