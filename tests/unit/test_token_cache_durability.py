"""Issue 22, item 7: a token-cache entry whose arrays do not match its manifest (a crash published
the manifest before the arrays reached the disk) is built again with a warning, never used."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from hvdtrain import DistContext, load_config
from hvdtrain_recipes.bert_finetune import DEFAULTS, pretrained, text_data, text_sources

from envguard import TOKENIZER_VARIABLES, isolate_environ

pytest.importorskip("tokenizers")


@pytest.fixture(autouse=True)
def _tokenizer_environ(monkeypatch):
    isolate_environ(monkeypatch, TOKENIZER_VARIABLES)  # tokenising sets them in this process


def _load(tmp_path):
    train, _ = text_data.embedded_movie_reviews(max_train=120)
    data = tmp_path / "reviews.csv"
    if not data.exists():
        with open(data, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(("sentence", "sentiment"))
            writer.writerows(zip(train.texts, train.labels))
    config = load_config(DEFAULTS, recipe="bert-finetune", output=str(tmp_path / "run"), overrides=[
        f"text.cache_dir={tmp_path / 'cache'}", "text.text_column=sentence", "text.label_column=sentiment",
        f"data.path={data}"])
    (arrays, _), = text_sources.load_files([data], config, DistContext(), pretrained.embedded_model_dir(),
                                           text_sources.no_barrier)
    return arrays


@pytest.mark.parametrize("array, how", [("ids.bin", "truncated"), ("labels.bin", "empty"),
                                        ("offsets.bin", "zeroed")])
def test_an_entry_whose_arrays_do_not_match_its_manifest_is_rebuilt_with_a_warning(tmp_path, capsys, array, how):
    first = _load(tmp_path)
    ids, offsets, labels = np.array(first.ids), np.array(first.offsets), np.array(first.labels)
    del first
    entry, = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    file = entry / array
    data = file.read_bytes()
    # what a crash leaves when the manifest reached the disk and the arrays did not (all of them)
    file.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "zeroed": bytes(len(data))}[how])
    capsys.readouterr()

    again = _load(tmp_path)
    err = capsys.readouterr().err
    assert str(entry) in err and array in err and "building it again" in err
    assert np.array_equal(again.ids, ids) and np.array_equal(again.offsets, offsets)
    assert np.array_equal(again.labels, labels)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) == [entry.name]  # nothing left over


def test_a_killed_builders_temporary_folder_is_removed_by_the_next_build(tmp_path):
    _load(tmp_path)
    entry, = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    stale = entry.with_name(f"{entry.name}.tmp-otherhost-12345")  # a builder killed mid-build
    stale.mkdir()
    (stale / "ids.bin").write_bytes(b"\0" * 4096)
    (entry / "manifest.json").unlink()  # the entry must be built again
    _load(tmp_path)
    assert not stale.exists()
