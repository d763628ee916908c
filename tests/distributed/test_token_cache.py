"""bert-finetune's token cache and sentence pairs under real `horovodrun -np 2 -H localhost:2 --gloo`.

* the cache is built by one rank while the other waits, then both read it: every row each rank
  gets (its epoch-0 training shard, its validation shard) has exactly the token and segment ids of
  a plain one-process tokenisation of that file row; a second job (TensorFlow: its
  ``segment_ids``, where the first job was torch's ``token_type_ids``) tokenises nothing;
* bad rows are skipped and counted in the rank-0 report;
* sentence pairs (`text.text_pair_column`) train in both frameworks: parameters identical on both
  ranks afterwards and moved from the start (tests/distributed/workers/bert_ranks.py).
"""

from __future__ import annotations

import json
import sys

import pytest

from jobs import REPO, horovodrun

WORKERS = REPO / "tests" / "distributed" / "workers"
sys.path.insert(0, str(WORKERS))

pytest.importorskip("transformers")

from bert_tiny_model import make_tiny_bert, movie_sentences  # noqa: E402

QUIET = {"train.log_every": 0, "train.progress_bar": False, "train.tensorboard": False}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """A tiny BERT; a training CSV of 120 sentence pairs plus 2 bad rows; a validation JSONL of 40 pairs."""
    import csv

    root = tmp_path_factory.mktemp("pairs")
    train, val = movie_sentences(240, 80)
    model_dir = make_tiny_bert(root / "tiny-bert", train.texts, hidden_act="gelu")
    with open(root / "train.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["premise", "hypothesis", "label"])
        for i in range(120):
            writer.writerow([train.texts[i], train.texts[239 - i], train.labels[i]])
            if i in (10, 70):
                writer.writerow(["", "an empty premise", "positive"] if i == 10 else ["no label", "here", ""])
    with open(root / "val.jsonl", "w", encoding="utf-8") as f:
        for i in range(40):
            row = {"premise": val.texts[i], "hypothesis": val.texts[79 - i], "label": val.labels[i]}
            f.write(json.dumps(row) + "\n")
    return {"model": model_dir, "train": root / "train.csv", "val": root / "val.jsonl"}


def _settings(pairs, tmp_path):
    return {"model.name": pairs["model"], "data.path": pairs["train"], "text.val_path": pairs["val"],
            "text.text_column": "premise", "text.text_pair_column": "hypothesis", "text.label_column": "label",
            "text.max_length": 48, "text.bad_rows": "skip", "text.cache_dir": tmp_path / "cache",
            "train.batch_size": 8, "optim.lr": 1e-3, "output": tmp_path / "run", **QUIET}


def _one_process_tokenisation(pairs):
    """line -> (ids, segment ids) of every usable row of both files, straight from ``tokenizers``."""
    import csv

    from hvdtrain_recipes.bert_finetune import tokenized

    tokenizer = tokenized.load_tokenizer(pairs["model"], 48)
    expected = {}
    with open(pairs["train"], newline="", encoding="utf-8") as f:
        rows = [(number, r) for number, r in enumerate(csv.reader(f), 1) if number > 1 and r[0] and r[2]]
    for (number, row), e in zip(rows, tokenizer.encode_batch([(r[0], r[1]) for _, r in rows])):
        expected[("train", number)] = (e.ids, e.type_ids)
    with open(pairs["val"], encoding="utf-8") as f:
        objects = [json.loads(line) for line in f]
    for number, e in enumerate(tokenizer.encode_batch([(o["premise"], o["hypothesis"]) for o in objects]), 1):
        expected[("val", number)] = (e.ids, e.type_ids)
    return expected


@pytest.mark.distributed
def test_cache_built_once_read_by_every_rank_like_one_process(tmp_path, pairs):
    pytest.importorskip("keras_hub")
    expected = _one_process_tokenisation(pairs)
    settings = [f"{k}={v}" for k, v in _settings(pairs, tmp_path).items()]
    views = []
    for job, framework in (("cold", "torch"), ("cached", "tensorflow")):  # both frameworks read the same cache
        out = tmp_path / job
        out.mkdir()
        proc = horovodrun(["python", WORKERS / "token_cache_ranks.py", out, framework, *settings], timeout=400)
        assert "skipped 2 row(s)" in proc.stdout and "(line 13)" in proc.stdout and "(line 74)" in proc.stdout
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert [r["size"] for r in ranks] == [2, 2] and all(r["memmap"] for r in ranks)
        views.append(ranks)
    cold, cached = views
    assert sorted(r["encoded_rows"] for r in cold) == [0, 160], "exactly one rank tokenises, once"
    assert [r["encoded_rows"] for r in cached] == [0, 0], "the second job tokenises nothing"
    train_lines = set()
    for rank in cold:
        for split in ("train", "val"):
            assert rank[split], "every rank gets rows"
            for row in rank[split]:
                assert (row["ids"], row["segments"]) == expected[(split, row["line"])], (split, row["line"])
                assert 1 in row["segments"]
        train_lines |= {row["line"] for row in rank["train"]}
    assert len(train_lines) == 120, "the two training shards cover the training file"
    assert [r["train"] for r in cached] == [r["train"] for r in cold] and [r["val"] for r in cached] == [
        r["val"] for r in cold]


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_sentence_pairs_train_on_two_ranks(tmp_path, pairs, framework):
    if framework == "tensorflow":
        pytest.importorskip("keras_hub")
    report_path = tmp_path / "report.json"
    settings = _settings(pairs, tmp_path)
    horovodrun(["python", WORKERS / "bert_ranks.py", report_path, framework, *[f"{k}={v}" for k, v in settings.items()],
                "train.epochs=1", "data.max_train_samples=48", "data.max_val_samples=16"], timeout=400)
    report = json.loads(report_path.read_text())
    assert report["world_size"] == 2 and report["spread"] == 0.0
    assert report["moved"] > 1e-4, "training did not change the parameters: the spread check proves nothing"
    assert 0.0 <= report["history"][0]["val_accuracy"] <= 1.0
