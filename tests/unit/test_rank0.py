"""hvdtrain.core.rank0 and DistContext: only rank 0 prints and writes."""

from __future__ import annotations

import json

import pytest

from hvdtrain.core.adapter import DistContext
from hvdtrain.core.rank0 import RankZeroGate


def test_rank_zero_prints_writes_and_warns(tmp_path, capsys):
    gate = RankZeroGate(0)
    assert gate.active
    gate.print("hello", 3, sep="-")
    gate.warn("careful")
    path = tmp_path / "metrics.jsonl"
    gate.append_jsonl(path, {"epoch": 1, "loss": 0.5})
    gate.append_jsonl(path, {"epoch": 2, "loss": 0.25})
    out, err = capsys.readouterr()
    assert out == "hello-3\n"
    assert err == "hvdtrain: warning: careful\n"
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.25}]


@pytest.mark.parametrize("rank", [1, 2, 7])
def test_other_ranks_do_nothing(tmp_path, capsys, rank):
    gate = RankZeroGate(rank)
    assert not gate.active
    gate.print("hello")
    gate.warn("careful")
    gate.append_jsonl(tmp_path / "metrics.jsonl", {"epoch": 1})
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_dist_context():
    assert DistContext() == DistContext(rank=0, size=1, local_rank=0, local_size=1)
    assert DistContext().is_main
    assert DistContext(rank=0, size=4).is_main
    assert not DistContext(rank=3, size=4, local_rank=1, local_size=2).is_main
