"""A shard pattern from a config cannot exhaust memory: :func:`hvdtrain.data.braces.expand` counts
the names before listing them and refuses more than ``MAX_NAMES`` (or braces nested deeper than
``MAX_DEPTH``) in one line naming the pattern, secrets in its URL hidden."""

from __future__ import annotations

import pytest

from hvdtrain.data import braces, remote
from hvdtrain.data.errors import DataError


@pytest.mark.parametrize("pattern, expected", [
    ("train-{000000..999999999999}.tar", "stands for 1,000,000,000,000 names, more than the 1,000,000"),
    ("shard" + "{a,b}" * 40, "stands for 1,099,511,627,776 names"),  # 2**40: each group doubles
    ("x" + "{a," * 20 + "b" + "}" * 20, "braces nested 20 deep, more than 16"),
    ("{a,b}" * 5000, "too many brace groups"),
])
def test_a_pattern_too_large_is_refused_naming_it(pattern, expected):
    with pytest.raises(DataError) as err:
        braces.expand(pattern)
    assert expected in str(err.value) and str(err.value).startswith(pattern[:40])


def test_the_limit_is_on_the_names_counted(monkeypatch):
    monkeypatch.setattr(braces, "MAX_NAMES", 6)
    assert braces.expand("{a,b}-{1..3}") == ["a-1", "a-2", "a-3", "b-1", "b-2", "b-3"]
    with pytest.raises(DataError, match="stands for 8 names, more than the 6"):
        braces.expand("{a,b}-{1..4}")


def test_a_remote_pattern_is_refused_before_anything_is_fetched():
    with pytest.raises(DataError) as err:
        remote.expand("https://user:s3cret@data.example/train-{0..99999999}.tar")
    assert "s3cret" not in str(err.value) and "stands for 100,000,000 names" in str(err.value)


def test_ranges_that_are_no_numbers_stay_text():
    assert braces.expand("s{0..4..0}") == ["s{0..4..0}"]  # a zero step
    assert braces.expand("x{0.." + "9" * 30 + "}") == ["x{0.." + "9" * 30 + "}"]  # beyond 18 digits
    assert braces.expand("x{a..c}") == ["x{a..c}"]
