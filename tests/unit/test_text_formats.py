"""bert-finetune reads Parquet and Arrow text datasets as Hugging Face ``datasets`` writes them (issue
25, item 3): a Parquet file with a ClassLabel column, a Hub-style folder of Parquet shards, a
``save_to_disk`` folder and a ``DatasetDict`` folder give the same token arrays and labels as the
same rows in a CSV file, through the token cache; bad rows are named by shard and row, a missing
column lists the columns there are, a changed shard rebuilds the cache, and reading keeps Arrow's
memory to a batch, however large the file."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from hvdtrain import DistContext, load_config
from hvdtrain_recipes.bert_finetune import DEFAULTS, pretrained, table_rows, text_data, text_sources, tokenized
from hvdtrain_recipes.bert_finetune.text_data import TextDataError

from envguard import TOKENIZER_VARIABLES, isolate_environ

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pytest.importorskip("tokenizers")

datasets.disable_progress_bars()
TRAIN, VAL = text_data.embedded_movie_reviews(max_train=150)
NAMES = ["negative", "positive"]
FEATURES = datasets.Features({"sentence": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                              "sentiment": datasets.ClassLabel(names=NAMES)})


@pytest.fixture(autouse=True)
def _tokenizer_environ(monkeypatch):
    isolate_environ(monkeypatch, TOKENIZER_VARIABLES)


@pytest.fixture
def encoder_calls(monkeypatch):
    """How often the batch encoder ran (the real one, counted)."""
    calls = []
    real = tokenized.encode_chunk

    def counted(*args, **kwargs):
        calls.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenized, "encode_chunk", counted)
    return calls


def rows_of(data, n, offset=0):
    """Real sentence pairs (a review and another one) with the first one's label."""
    return [(data.texts[i + offset], data.texts[-1 - i - offset], data.labels[i + offset]) for i in range(n)]


def dataset(rows):
    """The rows as a ``datasets.Dataset`` with a ClassLabel label column (stored as ints)."""
    return datasets.Dataset.from_dict({"sentence": [r[0] for r in rows], "hypothesis": [r[1] for r in rows],
                                       "sentiment": [NAMES.index(r[2]) for r in rows]}, features=FEATURES)


def write_csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence", "hypothesis", "sentiment"])
        writer.writerows(rows)
    return path


def hub_folder(root, train, val, shards=3):
    """A dataset laid out as the Hub stores it: data/train-0000K-of-0000N.parquet, data/validation-..."""
    (root / "data").mkdir(parents=True)
    for k in range(shards):
        part = dataset(train).shard(shards, k, contiguous=True)
        part.to_parquet(root / f"data/train-{k:05d}-of-{shards:05d}.parquet")
    dataset(val).to_parquet(root / "data/validation-00000-of-00001.parquet")
    (root / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n")
    return root


def config_for(tmp_path, **overrides):
    settings = {"text.cache_dir": tmp_path / "cache", "text.text_column": "sentence",
                "text.label_column": "sentiment", "text.text_pair_column": "hypothesis", **overrides}
    return load_config(DEFAULTS, overrides=[f"{k}={v}" for k, v in settings.items()], recipe="bert-finetune",
                       output=str(tmp_path / "run"))


def load(tmp_path, path, split=None, **overrides):
    config = config_for(tmp_path, **{"data.path": path, **overrides})
    (arrays, bad), = text_sources.load_files([path], config, DistContext(), pretrained.embedded_model_dir(),
                                             text_sources.no_barrier, [split])
    return arrays, bad


def tokens_and_labels(arrays):
    """Every row's token ids and segment ids, and its label name."""
    rows = [arrays.row(i) for i in range(len(arrays))]
    return ([r[0].tolist() for r in rows], [r[1].tolist() for r in rows],
            [arrays.label_vocab[code] for code in np.asarray(arrays.labels)])


def test_csv_parquet_hub_folder_and_save_to_disk_give_the_same_tokens(tmp_path, monkeypatch, encoder_calls):
    monkeypatch.setattr(table_rows, "BATCH_ROWS", 16)  # many batches, crossing the shards' ends
    train, val = rows_of(TRAIN, 120), rows_of(VAL, 40)
    sources = {"csv": (write_csv(tmp_path / "d.csv", train), None)}
    dataset(train).to_parquet(tmp_path / "d.parquet")
    sources["parquet"] = (tmp_path / "d.parquet", None)
    sources["hub folder"] = (hub_folder(tmp_path / "hub", train, val), "train")
    sources["glob"] = (str(tmp_path / "hub" / "data" / "train-*.parquet"), None)
    dataset(train).save_to_disk(tmp_path / "saved", num_shards=2)
    sources["save_to_disk"] = (tmp_path / "saved", None)
    datasets.DatasetDict({"train": dataset(train), "validation": dataset(val)}).save_to_disk(tmp_path / "dict")
    sources["DatasetDict"] = (tmp_path / "dict", "train")
    assert len(list((tmp_path / "saved").glob("*.arrow"))) == 2

    loaded = {name: load(tmp_path, path, split) for name, (path, split) in sources.items()}
    ids, types, labels = tokens_and_labels(loaded["csv"][0])
    assert labels == [r[2] for r in train] and any(1 in t for t in types), "pairs with second segments"
    model = tokenized.load_tokenizer(pretrained.embedded_model_dir(), config_for(tmp_path).text.max_length)
    assert ids == [e.ids for e in model.encode_batch([(r[0], r[1]) for r in train])]
    for name, (arrays, bad) in loaded.items():
        assert tokens_and_labels(arrays) == (ids, types, labels), name
        assert bad.total == 0 and isinstance(arrays.ids, np.memmap), name
        expected_lines = range(2, 122) if name == "csv" else range(120)  # CSV lines; table rows from 0
        assert arrays.lines.tolist() == list(expected_lines), name
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == len(sources)

    plain, _ = load(tmp_path, tmp_path / "dict", "train", **{"text.cache": False})  # in memory, every rank
    assert not isinstance(plain.ids, np.memmap) and tokens_and_labels(plain) == (ids, types, labels)
    assert text_data.read_labelled_file(tmp_path / "saved", "sentence", "sentiment").labels == labels


@pytest.mark.parametrize("layout", ["hub folder", "DatasetDict"])
def test_a_folder_of_splits_trains_on_train_and_validates_on_validation(tmp_path, layout):
    train, val = rows_of(TRAIN, 60), rows_of(VAL, 20)
    if layout == "hub folder":
        folder = hub_folder(tmp_path / "hub", train, val, shards=2)
    else:
        folder = tmp_path / "dict"
        datasets.DatasetDict({"train": dataset(train), "validation": dataset(val)}).save_to_disk(folder)
    model = pretrained.embedded_model_dir()
    train_split, val_split = text_sources.load_splits(config_for(tmp_path, **{"data.path": folder}), DistContext(),
                                                      model)
    assert len(train_split.rows) == 60 and len(val_split.rows) == 20  # nothing held out of train
    csv_val, _ = load(tmp_path, write_csv(tmp_path / "val.csv", val))
    assert tokens_and_labels(val_split.arrays) == tokens_and_labels(csv_val)
    assert "split 'validation'" in val_split.source and "split 'train'" in train_split.source

    other = write_csv(tmp_path / "other.csv", rows_of(VAL, 10, offset=50))  # text.val_path wins
    _, given = text_sources.load_splits(config_for(tmp_path, **{"data.path": folder, "text.val_path": other}),
                                        DistContext(), model)
    assert len(given.rows) == 10 and given.source == str(other)


def test_splits_without_train_or_validation_are_named(tmp_path):
    train, val = rows_of(TRAIN, 30), rows_of(VAL, 10)
    folder = tmp_path / "dict"
    datasets.DatasetDict({"training": dataset(train), "holdout": dataset(val)}).save_to_disk(folder)
    model = pretrained.embedded_model_dir()
    with pytest.raises(TextDataError) as err:
        text_sources.load_splits(config_for(tmp_path, **{"data.path": folder}), DistContext(), model)
    assert str(err.value) == (f"data.path={folder} has the splits training, holdout but no train split; point "
                              f"data.path at one split's folder or files (a glob)")
    config = config_for(tmp_path, **{"data.path": folder / "training", "text.val_path": folder})
    with pytest.raises(TextDataError, match=r"text.val_path=.* has the splits training, holdout but no "
                                            r"validation / val / valid / dev / test split"):
        text_sources.load_splits(config, DistContext(), model)
    only_train = tmp_path / "only-train"  # a train split alone: text.val_fraction holds rows out, as for a file
    datasets.DatasetDict({"train": dataset(train)}).save_to_disk(only_train)
    fitted, held = text_sources.load_splits(config_for(tmp_path, **{"data.path": only_train}), DistContext(), model)
    assert (len(fitted.rows), len(held.rows)) == (27, 3) and held.arrays is fitted.arrays


def test_bad_rows_are_named_by_shard_and_row(tmp_path):
    rows = rows_of(TRAIN, 12)
    columns = {"sentence": [r[0] for r in rows], "hypothesis": [r[1] for r in rows],
               "sentiment": [NAMES.index(r[2]) for r in rows]}
    columns["sentence"][7] = None      # shard 1, its row 1
    columns["hypothesis"][8] = "   "   # shard 1, its row 2
    columns["sentiment"][10] = -1      # the Hub's "no label" (test splits)
    table = datasets.Dataset.from_dict(columns, features=FEATURES)
    (tmp_path / "hub" / "data").mkdir(parents=True)
    for k in range(2):
        table.shard(2, k, contiguous=True).to_parquet(tmp_path / f"hub/data/train-{k:05d}-of-00002.parquet")
    folder = tmp_path / "hub" / "data"
    with pytest.raises(TextDataError) as err:
        load(tmp_path, folder)
    message = str(err.value)
    assert message.startswith(f"{folder / 'train-00001-of-00002.parquet'} row 1 (from 0): no text in column "
                              f"'sentence' (text.bad_rows=error") and "\n" not in message
    arrays, bad = load(tmp_path, folder, **{"text.bad_rows": "skip"})
    assert len(arrays) == 9 and arrays.lines.tolist() == [0, 1, 2, 3, 4, 5, 6, 9, 11]
    assert bad.counts == {"no text in column 'sentence'": 1, "empty text in column 'hypothesis'": 1,
                          "no label in column 'sentiment'": 1}
    assert bad.summary().startswith(f"{folder}: skipped 3 row(s): 1 no text in column 'sentence' (row 7)")
    assert bad.where(10) == f"{folder / 'train-00001-of-00002.parquet'} row 4 (from 0)"
    _, cached = load(tmp_path, folder, **{"text.bad_rows": "skip"})  # from the cache: counted the same
    assert cached.counts == bad.counts
    assert cached.where(7) == f"{folder / 'train-00001-of-00002.parquet'} row 1 (from 0)"


@pytest.mark.parametrize("layout", ["parquet", "save_to_disk"])
def test_a_missing_column_lists_the_columns_found(tmp_path, layout):
    path = tmp_path / "d.parquet" if layout == "parquet" else tmp_path / "saved"
    if layout == "parquet":
        dataset(rows_of(TRAIN, 8)).to_parquet(path)
    else:
        dataset(rows_of(TRAIN, 8)).save_to_disk(path)
    with pytest.raises(TextDataError) as err:
        load(tmp_path, path, **{"text.text_column": "review"})
    shown = path if layout == "parquet" else path / "data-00000-of-00001.arrow"
    assert str(err.value) == (f"data file {shown} has no column 'review' (--text-column); its columns are: "
                              f"sentence, hypothesis, sentiment")


def test_not_a_parquet_file_and_no_files_are_named(tmp_path):
    (tmp_path / "d.parquet").write_text("sentence,sentiment\nfine,positive\n")
    with pytest.raises(TextDataError, match=r"d\.parquet is not a readable Parquet file"):
        load(tmp_path, tmp_path / "d.parquet")
    with pytest.raises(TextDataError, match=r"train-\*\.parquet matches no Parquet \(\.parquet\) or Arrow"):
        load(tmp_path, str(tmp_path / "train-*.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TextDataError, match="holds no Parquet .* nor a datasets save_to_disk folder"):
        load(tmp_path, tmp_path / "empty")


def test_a_changed_shard_rebuilds_the_token_cache(tmp_path, encoder_calls):
    train = rows_of(TRAIN, 60)
    folder = hub_folder(tmp_path / "hub", train, rows_of(VAL, 10), shards=3)
    first, _ = load(tmp_path, folder, "train")
    assert len(encoder_calls) == 1
    again, _ = load(tmp_path, folder, "train")
    assert len(encoder_calls) == 1 and np.array_equal(again.ids, first.ids)  # reused
    load(tmp_path, folder, "validation")  # a split of its own: its own entry
    assert len(encoder_calls) == 2

    changed = rows_of(TRAIN, 20, offset=100)  # the middle shard rewritten with other rows
    shard = folder / "data" / "train-00001-of-00003.parquet"
    before = os.stat(shard)
    dataset(changed).to_parquet(shard)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    rebuilt, _ = load(tmp_path, folder, "train")
    assert len(encoder_calls) == 3
    assert tokens_and_labels(rebuilt) == tokens_and_labels(load(tmp_path, write_csv(
        tmp_path / "changed.csv", train[:20] + changed + train[40:]))[0])
    dataset(changed).to_parquet(folder / "data" / "train-00003-of-00003.parquet")  # a shard added
    grown, _ = load(tmp_path, folder, "train")
    assert len(encoder_calls) == 5 and len(grown) == 80  # (the CSV above was one build)


@pytest.mark.parametrize("layout", ["parquet", "save_to_disk"])
def test_reading_a_large_table_holds_one_batch_not_the_file(tmp_path, layout):
    """Arrow's memory while every row is streamed stays far below the text column's size."""
    texts = [f"{TRAIN.texts[i % len(TRAIN)]} {i} " * 4 for i in range(60_000)]
    table = datasets.Dataset.from_dict({"sentence": texts, "sentiment": [i % 2 for i in range(60_000)]},
                                       features=datasets.Features({"sentence": datasets.Value("string"),
                                                                   "sentiment": datasets.ClassLabel(names=NAMES)}))
    path = tmp_path / ("d.parquet" if layout == "parquet" else "saved")
    table.to_parquet(path) if layout == "parquet" else table.save_to_disk(path)
    size = sum(len(t) for t in texts)
    assert size > 20 << 20
    peak, count = 0, 0
    start = pa.total_allocated_bytes()
    for _, text, _, label, _ in text_data.stream_rows(path, "sentence", "sentiment"):
        count += 1
        if count % 256 == 0:
            peak = max(peak, pa.total_allocated_bytes() - start)
    assert count == 60_000 and label == "positive" and text == texts[-1]
    assert peak < size / 4, (peak, size)  # measured: 5 MiB of 26 (read whole: more than 26)


def test_splits_are_read_from_the_hubs_file_names(tmp_path):
    train, val = rows_of(TRAIN, 12), rows_of(VAL, 4)
    flat = tmp_path / "flat"  # train.parquet, test.parquet
    flat.mkdir()
    dataset(train).to_parquet(flat / "train.parquet")
    dataset(val).to_parquet(flat / "test.parquet")
    nested = tmp_path / "nested"  # default/train/0000.parquet, the Hub's parquet conversion
    for split, rows in (("train", train), ("validation", val)):
        (nested / "default" / split).mkdir(parents=True)
        dataset(rows).to_parquet(nested / "default" / split / "0000.parquet")
    for folder, validation in ((flat, "test"), (nested, "validation")):
        assert table_rows.pick_split(folder, "train", "data.path") == "train"
        assert table_rows.pick_split(folder, "validation", "data.path") == validation
        texts = text_data.read_labelled_file(folder, "sentence", "sentiment", split=validation).texts
        assert texts == [r[0] for r in val]
    shards = tmp_path / "shards"  # one group of shards, whatever its name: one table
    shards.mkdir()
    for k in range(2):
        dataset(train).shard(2, k, contiguous=True).to_parquet(shards / f"part-{k:05d}-of-00002.parquet")
    assert table_rows.split_names(shards) == []
    assert text_data.read_labelled_file(shards, "sentence", "sentiment").labels == [r[2] for r in train]
    bracketed = write_csv(tmp_path / "reviews[2024].csv", train)  # glob characters in a file's name: still a CSV
    assert text_data.read_labelled_file(bracketed, "sentence", "sentiment").texts == [r[0] for r in train]
