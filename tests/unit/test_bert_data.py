"""bert-finetune data, labels, tokenisation and metrics (no deep-learning framework needed).

Bad input (missing column, empty file, unknown validation label, model directory without a
tokenizer) must stop with an error that names the file and the problem.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from hvdtrain import DistContext, load_config
from hvdtrain_recipes.bert_finetune import DEFAULTS, common, pretrained, text_data, tokenized
from hvdtrain_recipes.bert_finetune.text_data import TextDataError

from envguard import TOKENIZER_VARIABLES, isolate_environ

pytest.importorskip("tokenizers")


@pytest.fixture(autouse=True)
def _tokenizer_environ(monkeypatch):
    isolate_environ(monkeypatch, TOKENIZER_VARIABLES)  # tokenising sets them in this process

ROWS = [("a fine film", "pos"), ("dull and slow", "neg"), ("great fun", "pos"), ("a mess", "neg")]


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def csv_file(path, rows=ROWS, header="sentence,sentiment"):
    return write(path, header + "\n" + "".join(f'"{t}",{label}\n' for t, label in rows))


def config_for(tmp_path, **overrides):
    sets = [f"{k}={v}" for k, v in overrides.items()]
    return load_config(DEFAULTS, overrides=sets, recipe="bert-finetune", output=str(tmp_path / "run"))


# --------------------------------------------------------------------------- files


def test_reads_csv_tsv_and_jsonl(tmp_path):
    csv_data = text_data.read_labelled_file(csv_file(tmp_path / "d.csv"), "sentence", "sentiment")
    tsv = write(tmp_path / "d.tsv", "sentiment\tsentence\n" + "".join(f"{l}\t{t}\n" for t, l in ROWS))
    tsv_data = text_data.read_labelled_file(tsv, "sentence", "sentiment")
    jsonl = write(tmp_path / "d.jsonl", "".join(json.dumps({"sentence": t, "sentiment": l}) + "\n" for t, l in ROWS))
    jsonl_data = text_data.read_labelled_file(jsonl, "sentence", "sentiment")
    for data in (csv_data, tsv_data, jsonl_data):
        assert data.texts == [t for t, _ in ROWS] and data.labels == [l for _, l in ROWS]


def test_jsonl_integer_labels_keep_numeric_order(tmp_path):
    rows = "".join(json.dumps({"text": f"t{i}", "label": i % 11}) + "\n" for i in range(22))
    data = text_data.read_labelled_file(write(tmp_path / "d.jsonl", rows), "text", "label")
    assert text_data.label_names(data.labels) == [str(i) for i in range(11)]  # 10 after 9, not after 1


def test_missing_column_names_it_and_the_columns_present(tmp_path):
    path = csv_file(tmp_path / "d.csv")
    with pytest.raises(TextDataError) as err:
        text_data.read_labelled_file(path, "text", "sentiment")
    message = str(err.value)
    assert str(path) in message and "'text'" in message and "--text-column" in message
    assert "sentence, sentiment" in message


@pytest.mark.parametrize("name,content", [("empty.csv", ""), ("header.csv", "sentence,sentiment\n"),
                                          ("empty.jsonl", "\n\n")])
def test_empty_file_is_an_error(tmp_path, name, content):
    path = write(tmp_path / name, content)
    with pytest.raises(TextDataError, match="empty"):
        text_data.read_labelled_file(path, "sentence", "sentiment")


def test_missing_file_and_unknown_extension(tmp_path):
    with pytest.raises(TextDataError, match="does not exist"):
        text_data.read_labelled_file(tmp_path / "nope.csv", "text", "label")
    with pytest.raises(TextDataError, match=r"unsupported file type '\.xlsx'.*\.csv"):
        text_data.read_labelled_file(write(tmp_path / "d.xlsx", "x"), "text", "label")
    with pytest.raises(TextDataError, match=r"d\.parquet is not a readable Parquet file"):
        text_data.read_labelled_file(write(tmp_path / "d.parquet", "x"), "text", "label")


def test_unknown_validation_label_is_named(tmp_path):
    train = csv_file(tmp_path / "train.csv")
    val = csv_file(tmp_path / "val.csv", rows=[("so-so", "meh"), ("fine", "pos")])
    config = config_for(tmp_path, **{"data.path": train, "text.val_path": val, "text.text_column": "sentence",
                                     "text.label_column": "sentiment"})
    with pytest.raises(TextDataError) as err:
        common.prepare(config, DistContext(), tokenized.TORCH_INPUTS, "int64")
    message = str(err.value)
    assert "'meh'" in message and str(val) in message and "neg, pos" in message
    assert not (tmp_path / "run" / common.LABELS_FILE).exists()


def test_model_directory_without_tokenizer(tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(pretrained.embedded_model_dir(), model_dir, ignore=shutil.ignore_patterns("tokenizer.json"))
    with pytest.raises(pretrained.ModelDirError) as err:
        pretrained.resolve_model_dir(str(model_dir))
    assert str(model_dir) in str(err.value) and "tokenizer.json" in str(err.value)
    with pytest.raises(pretrained.ModelDirError, match="does not exist"):
        pretrained.resolve_model_dir(str(tmp_path / "no" / "such" / "model"))


def test_max_length_beyond_position_embeddings(tmp_path):
    config = config_for(tmp_path, **{"text.max_length": 1024})
    with pytest.raises(pretrained.ModelDirError, match="max_position_embeddings=512"):
        common.prepare(config, DistContext(), tokenized.TORCH_INPUTS, "int64")


# --------------------------------------------------------------------------- embedded split and labels


def test_embedded_split_is_fixed_disjoint_and_balanced():
    train, val = text_data.embedded_movie_reviews()
    assert (len(train), len(val)) == (2000, 1000)
    assert not set(train.texts) & set(val.texts)
    assert set(train.labels) == set(val.labels) == {"negative", "positive"}
    assert 0.4 < train.labels.count("positive") / len(train) < 0.6
    again_train, again_val = text_data.embedded_movie_reviews(max_train=500)
    assert again_val.texts == val.texts and again_train.texts == train.texts[:500]


def test_prepare_writes_labels_and_refuses_other_labels_on_resume(tmp_path):
    train = csv_file(tmp_path / "train.csv", rows=ROWS * 5)
    config = config_for(tmp_path, **{"data.path": train, "text.text_column": "sentence",
                                     "text.label_column": "sentiment", "text.val_fraction": 0.2})
    data = common.prepare(config, DistContext(), tokenized.KERAS_HUB_INPUTS, "int32")
    assert (len(data.train), len(data.val)) == (16, 4) and data.labels == ["neg", "pos"]
    saved = json.loads((tmp_path / "run" / common.LABELS_FILE).read_text())
    assert saved["label2id"] == {"neg": 0, "pos": 1} and saved["max_length"] == 64
    inputs, labels = data.train.get_batch(np.arange(3), 0)
    assert set(inputs) == {"token_ids", "padding_mask", "segment_ids"} and inputs["token_ids"].dtype == np.int32

    other = csv_file(tmp_path / "other.csv", rows=[(t, "x" + l) for t, l in ROWS * 5])
    resume = config_for(tmp_path, **{"data.path": other, "text.text_column": "sentence",
                                     "text.label_column": "sentiment", "checkpoint.resume": True})
    with pytest.raises(TextDataError, match="cannot resume"):
        common.prepare(resume, DistContext(), tokenized.TORCH_INPUTS, "int64")
    assert json.loads((tmp_path / "run" / common.LABELS_FILE).read_text()) == saved


# --------------------------------------------------------------------------- tokenisation and metrics


def test_dynamic_padding_rounds_up_and_truncates():
    tokenizer = tokenized.load_tokenizer(pretrained.embedded_model_dir(), 12)
    ids, segments = tokenized.encode(tokenizer, ["short", "a much longer sentence that will be cut at twelve tokens"])
    assert len(ids[0]) == 3 and len(ids[1]) == 12 and ids[1][0] == 101 and ids[1][-1] == 102
    batch = tokenized.pad_batch(ids[:1], segments[:1], 0, 8, 12)
    assert batch["input_ids"].shape == (1, 8) and batch["attention_mask"].sum() == 3
    both = tokenized.pad_batch(ids, segments, 0, 8, 12)
    assert both["input_ids"].shape == (2, 12)  # 12 rounded up to 16, then capped at max_length
    assert both["attention_mask"][0].tolist() == [1, 1, 1] + [0] * 9


def test_f1_and_accuracy_from_summed_counts():
    sums = {"correct": 7.0, "count": 10.0, "loss_sum": 1.0, "tp_1": 3.0, "fp_1": 1.0, "fn_1": 2.0}
    metrics = common.finalize_metrics(sums)
    assert metrics["accuracy"] == pytest.approx(0.7) and metrics["f1"] == pytest.approx(6 / 9)
    macro = common.finalize_metrics({"correct": 1.0, "count": 2.0, "tp_0": 1.0, "fp_0": 1.0, "fn_0": 0.0,
                                     "tp_1": 0.0, "fp_1": 0.0, "fn_1": 1.0, "tp_2": 0.0, "fp_2": 0.0, "fn_2": 0.0})
    assert macro["f1"] == pytest.approx((2 / 3 + 0 + 0) / 3)
    assert common.scored_classes(2) == [1] and common.scored_classes(3) == [0, 1, 2]
