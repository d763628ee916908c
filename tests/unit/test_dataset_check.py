"""The cross-rank data check's verdict (hvdtrain.core.dataset_check.compare) on the descriptions ranks
exchange, and the text datasets' fingerprints it compares (the real two-rank job:
tests/reliability/test_same_data.py)."""

import numpy as np

from hvdtrain.core.dataset_check import compare, describe
from hvdtrain_recipes.bert_finetune import tokenized


def record(host, train, val=(8, "v")):
    return {"host": host, "train": train, "val": val}


def test_equal_descriptions_pass():
    assert compare([record("a", (16, "f")), record("b", (16, "f"))]) is None


def test_unequal_counts_name_the_ranks_and_hosts():
    refusal = compare([record("node1", (16, "f")), record("node1", (16, "f")), record("node2", (15, "g"))])
    assert refusal.startswith("the ranks see different training data (ranks 0, 1 on node1: 16 samples, "
                              "fingerprint f; rank 2 on node2: 15 samples, fingerprint g)")
    assert "\n" not in refusal


def test_validation_differences_are_named_too():
    refusal = compare([record("a", (16, "f")), record("b", (16, "f"), val=(8, "w"))])
    assert "different validation data" in refusal and "rank 1 on b: 8 samples" in refusal


def text_split(labels):
    ids = np.arange(12, dtype=np.int32)
    arrays = tokenized.TokenArrays(ids, np.arange(0, 13, 3), np.zeros(4, np.int32), np.zeros(4, np.int32),
                                   np.arange(2, 6), ["x"])
    return tokenized.TokenizedTexts(arrays, np.arange(4), np.asarray(labels), pad=0, max_length=8)


def test_a_text_split_fingerprint_follows_its_label_mapping():
    same, other = describe(text_split([0, 1, 0, 1])), describe(text_split([0, 1, 0, 1]))
    assert same == other and same[0] == 4
    assert describe(text_split([1, 0, 1, 0])) != same  # the same rows under another label mapping
