"""bert-finetune's token cache, streamed reading, bad rows and sentence pairs (one process, no
deep-learning framework): built once and reused, the same token ids as a plain one-process
tokenisation, invalidated by a changed file or tokenizer, bad rows skipped and counted or named.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from hvdtrain import DistContext, load_config
from hvdtrain_recipes.bert_finetune import DEFAULTS, common, pretrained, text_data, text_sources, token_cache, tokenized
from hvdtrain_recipes.bert_finetune.text_data import TextDataError

from envguard import TOKENIZER_VARIABLES, isolate_environ

pytest.importorskip("tokenizers")


@pytest.fixture(autouse=True)
def _tokenizer_environ(monkeypatch):
    isolate_environ(monkeypatch, TOKENIZER_VARIABLES)  # tokenising sets them in this process

TRAIN, VAL = text_data.embedded_movie_reviews(max_train=300)


def write_csv(path, rows, header=("sentence", "other", "sentiment")):
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def pair_rows(n, offset=0):
    """Real sentence pairs: two review sentences and the first one's label."""
    return [(TRAIN.texts[i + offset], TRAIN.texts[-1 - i - offset], TRAIN.labels[i + offset]) for i in range(n)]


def config_for(tmp_path, **overrides):
    settings = {"text.cache_dir": tmp_path / "cache", "text.text_column": "sentence",
                "text.label_column": "sentiment", **overrides}
    return load_config(DEFAULTS, overrides=[f"{k}={v}" for k, v in settings.items()], recipe="bert-finetune",
                       output=str(tmp_path / "run"))


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


def model_dir():
    return pretrained.embedded_model_dir()


def expected(texts, pairs=None, max_length=64, directory=None):
    """A plain one-process tokenisation of the rows."""
    tokenizer = tokenized.load_tokenizer(directory or model_dir(), max_length)
    encodings = tokenizer.encode_batch(texts if pairs is None else list(zip(texts, pairs)))
    return [e.ids for e in encodings], [e.type_ids for e in encodings]


def all_rows(arrays):
    return [arrays.row(i) for i in range(len(arrays))]


def test_cache_is_built_once_reused_and_matches_one_process_tokenisation(tmp_path, encoder_calls, monkeypatch):
    monkeypatch.setattr(token_cache, "CHUNK_ROWS", 64)  # several chunks: streamed in pieces
    rows = pair_rows(200)
    data = write_csv(tmp_path / "pairs.csv", rows)
    config = config_for(tmp_path, **{"data.path": data, "text.text_pair_column": "other"})
    (arrays, bad), = text_sources.load_files([data], config, DistContext(), model_dir(), text_sources.no_barrier)
    assert len(encoder_calls) == 4 and sum(encoder_calls) == 200 and bad.total == 0
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(entries) == 1 and not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]
    manifest = token_cache.read_manifest(entries[0])
    assert manifest["rows"] == 200 and manifest["ids_dtype"] == "<u2" and isinstance(arrays.ids, np.memmap)

    ids, types = expected([r[0] for r in rows], [r[1] for r in rows])
    got = all_rows(arrays)
    assert [g[0].tolist() for g in got] == ids and [g[1].tolist() for g in got] == types
    assert any(1 in t for t in types), "the pairs must have second segments for this to test anything"
    assert arrays.lines.tolist() == list(range(2, 202))

    encoder_calls.clear()
    (again, _), = text_sources.load_files([data], config, DistContext(), model_dir(), text_sources.no_barrier)
    assert encoder_calls == [] and token_cache.read_manifest(entries[0])["built_at"] == manifest["built_at"]
    assert np.array_equal(again.ids, arrays.ids) and np.array_equal(again.offsets, arrays.offsets)

    task = common.prepare(config, DistContext(), tokenized.KERAS_HUB_INPUTS, "int32")
    batch, _ = task.train.get_batch(np.arange(4), 0)
    assert encoder_calls == [] and batch["segment_ids"].dtype == np.int32
    for position in range(4):
        row = task.train.rows[position]
        n = len(ids[row])
        assert batch["padding_mask"][position].sum() == n and batch["token_ids"][position, :n].tolist() == ids[row]
        assert batch["segment_ids"][position].tolist() == types[row] + [0] * (batch["segment_ids"].shape[1] - n)


def test_a_changed_file_or_tokenizer_makes_a_new_entry(tmp_path, encoder_calls):
    data = write_csv(tmp_path / "d.csv", pair_rows(50))
    config = config_for(tmp_path, **{"data.path": data})
    load = lambda d: text_sources.load_files([data], config, DistContext(), d, text_sources.no_barrier)  # noqa: E731
    load(model_dir())
    assert len(encoder_calls) == 1
    load(model_dir())
    assert len(encoder_calls) == 1

    with open(data, "a", encoding="utf-8") as f:  # the file changes: size and mtime
        f.write('"one more sentence",x,positive\n')
    (arrays, _), = load(model_dir())
    assert len(encoder_calls) == 2 and len(arrays) == 51

    other = tmp_path / "model"  # the same model, a changed tokenizer (lower-casing off)
    other.mkdir()
    tok = json.loads((model_dir() / "tokenizer.json").read_text())
    tok["normalizer"]["lowercase"] = False
    (other / "tokenizer.json").write_text(json.dumps(tok))
    (changed, _), = load(other)
    assert len(encoder_calls) == 3 and len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 3
    assert [r[0].tolist() for r in all_rows(changed)] == expected(
        [r[0] for r in pair_rows(50)] + ["one more sentence"], directory=other)[0]


def test_same_size_and_mtime_but_other_head_is_a_new_entry(tmp_path):
    data = write_csv(tmp_path / "d.csv", [("good", "", "positive"), ("bad", "", "negative")])
    before = token_cache.file_identity(data)
    stat = os.stat(data)
    data.write_bytes(data.read_bytes().replace(b"good", b"fine"))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = token_cache.file_identity(data)
    assert (after["size"], after["mtime_ns"]) == (before["size"], before["mtime_ns"])
    assert after["sha256_head_tail"] != before["sha256_head_tail"]


def test_in_memory_path_gives_the_same_arrays(tmp_path):
    data = write_csv(tmp_path / "d.csv", pair_rows(40))
    cached, = text_sources.load_files([data], config_for(tmp_path, **{"data.path": data}), DistContext(),
                                      model_dir(), text_sources.no_barrier)
    plain, = text_sources.load_files([data], config_for(tmp_path, **{"data.path": data, "text.cache": False}),
                                     DistContext(), model_dir(), text_sources.no_barrier)
    assert not isinstance(plain[0].ids, np.memmap)
    for name in ("ids", "offsets", "first", "labels", "lines"):
        assert np.array_equal(getattr(cached[0], name), getattr(plain[0], name)), name


# --------------------------------------------------------------------------- bad rows


BAD = ("sentence,other,sentiment\n"
       '"a fine film",x,positive\n'    # line 2
       ',x,negative\n'                 # line 3: empty text
       '"dull",x,\n'                   # line 4: empty label
       '"great fun",x,positive\n'
       '"so-so"\n'                     # line 6: no label column at all
       '"a mess",x,negative\n')


def test_bad_rows_are_skipped_and_counted(tmp_path, capsys):
    data = tmp_path / "bad.csv"
    data.write_text(BAD, encoding="utf-8")
    val = write_csv(tmp_path / "val.csv", [("nice", "x", "positive"), ("meh", "x", "neutral"),
                                           ("bad", "x", "negative")])
    config = config_for(tmp_path, **{"data.path": data, "text.val_path": val, "text.bad_rows": "skip"})
    task = common.prepare(config, DistContext(), tokenized.TORCH_INPUTS, "int64")
    assert len(task.train) == 3 and len(task.val) == 2 and task.labels == ["negative", "positive"]
    out = capsys.readouterr().out
    assert "skipped 3 row(s)" in out and "empty text in column 'sentence' (line 3)" in out
    assert "empty label in column 'sentiment' (line 4)" in out and "no label in column 'sentiment' (line 6)" in out
    assert f"{val}: skipped 1 row(s): 1 label 'neutral' is not among the training data's labels" in out

    # the same cache entry, now with text.bad_rows=error: the run stops naming the first bad line
    strict = config_for(tmp_path, **{"data.path": data, "text.val_path": val})
    with pytest.raises(TextDataError, match=r"bad\.csv line 3: empty text in column 'sentence'.*text\.bad_rows"):
        common.prepare(strict, DistContext(), tokenized.TORCH_INPUTS, "int64")


def test_bad_row_error_names_the_line_while_building(tmp_path):
    data = tmp_path / "bad.csv"
    data.write_text(BAD, encoding="utf-8")
    config = config_for(tmp_path, **{"data.path": data, "text.cache_dir": tmp_path / "fresh"})
    with pytest.raises(TextDataError, match=r"line 3: empty text"):
        common.prepare(config, DistContext(), tokenized.TORCH_INPUTS, "int64")
    assert [p.name for p in (tmp_path / "fresh").iterdir() if not p.name.endswith(".lock")] == []


def test_unknown_validation_label_error_names_the_line(tmp_path):
    train = write_csv(tmp_path / "train.csv", pair_rows(20))
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"sentence": t, "sentiment": l}) + "\n"
                           for t, l in [("ok", "positive"), ("meh", "neutral")]), encoding="utf-8")
    config = config_for(tmp_path, **{"data.path": train, "text.val_path": val})
    with pytest.raises(TextDataError, match=r"val\.jsonl line 2: label 'neutral' is not among the training data's "
                                            r"labels \(negative, positive\)"):
        common.prepare(config, DistContext(), tokenized.TORCH_INPUTS, "int64")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_file_that_is_not_utf8_is_an_error_naming_the_line(tmp_path, suffix):
    path = tmp_path / f"latin1{suffix}"
    if suffix == ".csv":
        text = "sentence,sentiment\ngood,positive\nfine,positive\ncaf\xe9 cr\xe8me,negative\n"
    else:
        text = "".join(json.dumps({"sentence": t, "sentiment": "x"}, ensure_ascii=False) + "\n"
                       for t in ("good", "fine", "caf\xe9"))
    path.write_bytes(text.encode("latin-1"))
    config = config_for(tmp_path, **{"data.path": path})
    with pytest.raises(TextDataError, match=rf"latin1\{suffix} line 4 is not UTF-8" if suffix == ".csv"
                       else rf"latin1\{suffix} line 3 is not UTF-8"):
        common.prepare(config, DistContext(), tokenized.TORCH_INPUTS, "int64")


def test_missing_pair_column_is_named(tmp_path):
    data = write_csv(tmp_path / "d.csv", pair_rows(10))
    config = config_for(tmp_path, **{"data.path": data, "text.text_pair_column": "hypothesis"})
    with pytest.raises(TextDataError, match=r"no column 'hypothesis' \(--text-pair-column\).*sentence, other"):
        common.prepare(config, DistContext(), tokenized.TORCH_INPUTS, "int64")


# --------------------------------------------------------------------------- threads and downloads


def test_tokenizer_threads_divide_the_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert tokenized.tokenizer_threads(None, 1) == 8 and tokenized.tokenizer_threads(None, 3) == 2
    assert tokenized.tokenizer_threads(None, 16) == 1 and tokenized.tokenizer_threads(5, 4) == 5
    tokenized.limit_threads(1)
    assert os.environ["RAYON_NUM_THREADS"] == "1" and os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_hub_download_once_per_host_order(monkeypatch, tmp_path):
    """Local rank 0 downloads before the barrier; the others read the cache offline after it."""
    events = []
    monkeypatch.setattr(pretrained, "_download",
                        lambda name, offline=False: events.append(("offline" if offline else "online", name))
                        or tmp_path)
    isolate_environ(monkeypatch, ("HF_HUB_OFFLINE",))  # download_once_per_host sets it
    barrier = lambda: events.append(("barrier",))  # noqa: E731
    pretrained.download_once_per_host("org/model", DistContext(rank=2, size=4, local_rank=0, local_size=2), barrier)
    assert events == [("online", "org/model"), ("barrier",)] and "HF_HUB_OFFLINE" not in os.environ
    events.clear()
    pretrained.download_once_per_host("org/model", DistContext(rank=3, size=4, local_rank=1, local_size=2), barrier)
    assert events == [("barrier",), ("offline", "org/model")] and os.environ["HF_HUB_OFFLINE"] == "1"


def test_hub_name_resolves_from_a_local_hub_cache_offline(monkeypatch, tmp_path):
    """The hub path for real, offline: a cache laid out like huggingface_hub's, no network."""
    pytest.importorskip("huggingface_hub")
    snapshot = tmp_path / "hub" / "models--hvdtrain--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(model_dir(), snapshot)
    (tmp_path / "hub" / "models--hvdtrain--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--hvdtrain--tiny" / "refs" / "main").write_text("0" * 40)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    path = pretrained._download("hvdtrain/tiny", offline=True)
    assert path == snapshot and (path / "tokenizer.json").is_file()


def test_a_waiting_rank_sleeps_until_the_builder_finishes(tmp_path, monkeypatch):
    """The ranks that do not build wait on the builder's lock, then see the whole entry, using
    almost no CPU (a collective would busy-poll a core each, taking the builder's cores). The
    witness is what the waiter did, not a clock: while the builder holds the lock, the waiter
    neither polls for the manifest nor sleeps in a loop (it is blocked in the lock)."""
    import threading
    import time

    from hvdtrain.data.build_once import file_lock

    path = write_csv(tmp_path / "train.csv", [(t, "x", lab) for t, lab in zip(TRAIN.texts[:64], TRAIN.labels)])
    config = config_for(tmp_path)
    record = token_cache.key_record(path, model_dir(), config.text.max_length, "sentence", "sentiment", None)
    entry = tmp_path / "cache" / token_cache.entry_name(record)
    tokenizer = tokenized.load_tokenizer(model_dir(), config.text.max_length)
    holding = threading.Event()

    locked = threading.Event()
    polls_while_locked = []
    real_sleep = time.sleep

    def counted_sleep(seconds):  # the waiter (this thread) polling; time.sleep as token_cache calls it
        if threading.current_thread() is threading.main_thread() and locked.is_set():
            polls_while_locked.append(seconds)
        real_sleep(seconds)

    def slow_builder():
        with file_lock(entry.with_name(entry.name + ".lock")):
            locked.set()
            holding.set()
            real_sleep(1.5)
            locked.clear()
        token_cache.build(entry, record, config.text, tokenizer, tokenizer.get_vocab_size())

    builder = threading.Thread(target=slow_builder)
    entry.parent.mkdir(parents=True)
    builder.start()
    holding.wait()
    monkeypatch.setattr(token_cache.time, "sleep", counted_sleep)
    token_cache.wait_until_built(entry, poll_seconds=0.05)
    assert (entry / token_cache.MANIFEST).is_file()
    assert polls_while_locked == []  # blocked on the lock for the builder's 1.5 s, not polling
    builder.join()
    arrays, _ = token_cache.open_entry(entry, record, "error")
    assert len(arrays) == 64
