"""The benchmark suite's arithmetic (benchmarks/analyze.py): ratios are medians of per-round ratios,
targets are judged on them, and the comm.overlap rounds (auto, the default, and always) are split as the worker labels them."""

import importlib.util
from pathlib import Path

import pytest

ANALYZE = Path(__file__).resolve().parents[2] / "benchmarks" / "analyze.py"


@pytest.fixture(scope="module")
def analyze():
    spec = importlib.util.spec_from_file_location("benchmarks_analyze", ANALYZE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overhead_data(rounds):
    return {"framework": "torch", "world_size": 2, "samples": 2048, "batch": 64, "skip_steps": 4, "rounds": rounds}


def test_overhead_rows_use_default_rounds_and_per_round_medians(analyze):
    rounds = [{"overlap": "auto", "hvdtrain": 100.0, "baseline": 100.0, "ddp": 125.0},
              {"overlap": "always", "hvdtrain": 90.0, "baseline": 100.0, "ddp": 100.0},
              {"overlap": "auto", "hvdtrain": 96.0, "baseline": 100.0, "ddp": 100.0},
              {"overlap": "always", "hvdtrain": 99.0, "baseline": 100.0, "ddp": 100.0},
              {"overlap": "auto", "hvdtrain": 300.0, "baseline": 200.0, "ddp": 200.0}]
    rows = {r["item"]: r for r in analyze.overhead(overhead_data(rounds))}
    assert set(rows) == {"1-torch", "1-torch-overlap", "2"}
    overhead = rows["1-torch"]
    assert overhead["ratios"] == [1.0, 0.96, 1.5] and overhead["ratio"] == 1.0 and overhead["met"] is True
    assert rows["2"]["ratios"] == [0.8, 0.96, 1.5] and rows["2"]["ratio"] == 0.96 and rows["2"]["met"] is False
    assert rows["1-torch-overlap"]["ratios"] == pytest.approx([1.0 / 0.9, 0.96 / 0.99])  # default / always


def test_overhead_below_target_is_not_met(analyze):
    rounds = [{"overlap": "auto", "hvdtrain": 98.5, "baseline": 100.0}] * 5  # issue 27's target: 0.99
    (row,) = analyze.overhead(overhead_data(rounds))
    assert row["ratio"] == pytest.approx(0.985) and row["met"] is False and row["target"] == ">= 0.99"
