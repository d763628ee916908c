"""Labelled text as users bring it (issue 22, item 9): a row with more fields than the header is a
bad row, the label mapping does not depend on the process's hash seed, a rare label held out for
validation keeps its id, and a file without line breaks is named without filling the memory."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from hvdtrain import DistContext, load_config
from hvdtrain_recipes.bert_finetune import DEFAULTS, common, text_data, tokenized
from hvdtrain_recipes.bert_finetune.text_data import TextDataError

from envguard import TOKENIZER_VARIABLES, isolate_environ

pytest.importorskip("tokenizers")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _tokenizer_environ(monkeypatch):
    isolate_environ(monkeypatch, TOKENIZER_VARIABLES)


def config_for(tmp_path, **overrides):
    sets = [f"{k}={v}" for k, v in {"text.text_column": "sentence", "text.label_column": "sentiment",
                                    "text.cache_dir": tmp_path / "tokens", **overrides}.items()]
    return load_config(DEFAULTS, overrides=sets, recipe="bert-finetune", output=str(tmp_path / "run"))


def test_an_unquoted_comma_is_a_bad_row_not_an_invented_label(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("sentence,sentiment\n" + '"a fine film",pos\n"dull",neg\n' * 5
                    + "good, but long,pos\n", encoding="utf-8")  # line 12: text "good", label " but long"
    with pytest.raises(TextDataError) as err:  # was: accepted under the default text.bad_rows=error
        text_data.read_labelled_file(data, "sentence", "sentiment")
    assert f"{data} line 12: more fields than the header's 2 (an unquoted comma" in str(err.value)
    with pytest.raises(TextDataError, match="line 12: more fields"):  # the recipe's path, through the token cache
        common.prepare(config_for(tmp_path, **{"data.path": data}), DistContext(), tokenized.TORCH_INPUTS, "int64")
    skipped = text_data.read_labelled_file(data, "sentence", "sentiment", bad_rows="skip")
    assert len(skipped) == 10 and sorted(set(skipped.labels)) == ["neg", "pos"]


def test_the_label_mapping_does_not_depend_on_the_hash_seed():
    code = ("from hvdtrain_recipes.bert_finetune.text_data import label_names; "
            "print(label_names(['nan', '1', '0', '2', 'x', '10', '3', 'NaN']))")
    seen = {subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(8)}
    assert seen == {"['0', '1', '2', '3', '10', 'NaN', 'nan', 'x']\n"}, seen  # was: a different order per seed


def test_a_rare_label_in_the_held_out_part_keeps_its_id(tmp_path):
    config = config_for(tmp_path, **{"text.val_fraction": 0.2})
    rows = [("a fine film", "pos"), ("dull and slow", "neg")] * 10 + [("odd", "pos")]
    _, held_out = text_data.split_fraction(len(rows), 0.2, config.train.seed, "")
    rows[held_out[0]] = ("a strange one", "rare")  # the only 'rare' row falls in the validation part
    data = tmp_path / "d.csv"
    data.write_text("sentence,sentiment\n" + "".join(f'"{t}",{l}\n' for t, l in rows), encoding="utf-8")
    config = config_for(tmp_path, **{"text.val_fraction": 0.2, "data.path": data})
    prepared = common.prepare(config, DistContext(), tokenized.TORCH_INPUTS, "int64")  # was: TextDataError
    assert prepared.labels == ["neg", "pos", "rare"] and len(prepared.val) == len(held_out)
    assert 2 in prepared.val.labels.tolist() and 2 not in prepared.train.labels.tolist()


def test_a_file_without_line_breaks_is_named_in_bounded_memory(tmp_path):
    data = tmp_path / "d.csv"
    with open(data, "wb") as f:
        f.write(b"sentence,sentiment\n")
        f.write(b"one long row, " * (64 << 20 >> 4))  # 56 MiB, no line break
    tracemalloc.start()
    try:
        with pytest.raises(TextDataError) as err:
            text_data.read_labelled_file(data, "sentence", "sentiment")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{data} line 2 is longer than 16 MiB" in str(err.value)
    assert peak < 3 * text_data.MAX_LINE_BYTES, peak  # about 2 x 16 MiB; was the whole line, twice (> 110 MiB)


def test_a_json_array_file_is_still_read(tmp_path):
    data = tmp_path / "d.json"
    data.write_text('\ufeff [{"sentence": "a", "sentiment": "x"}, {"sentence": "b", "sentiment": "y"}]',
                    encoding="utf-8")
    assert text_data.read_labelled_file(data, "sentence", "sentiment").labels == ["x", "y"]
    assert np.array_equal(text_data.encode_labels(["y", "x"], ["x", "y"], "d"), [1, 0])
