"""issue 10, item 7: every rank draws its own dropout masks (their data differ; so should the
noise), under real `horovodrun -np 2 --gloo`, both frameworks. Reproducibility is kept: the
per-rank streams derive from (seed, rank, position) and are checkpointed per rank
(tests/reliability/test_compression_resume.py, whose small CNN has dropout, still ends bitwise equal)."""

import json

import pytest

from jobs import REPO, horovodrun

WORKER = REPO / "tests" / "distributed" / "workers" / "dropout_masks.py"


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_dropout_masks_differ_between_ranks(tmp_path, framework):
    report_path = tmp_path / "report.json"
    horovodrun(["python", WORKER, framework, tmp_path / "run", report_path], timeout=300)
    report = json.loads(report_path.read_text())
    assert report["world_size"] == 2
    first, second = report["masks"]
    assert 64 < sum(first) < 192 and 64 < sum(second) < 192  # real dropout at rate 0.5
    assert first != second
