"""BENCHMARKS.md is generated (benchmarks/report.py): every hand-written section lives in
benchmarks/sections/ and is listed, so a benchmark run never drops one."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("benchmarks_report", REPO / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_section_file_is_listed_and_in_benchmarks_md():
    sections = _report().SECTIONS
    files = sorted(p.name for p in (REPO / "benchmarks" / "sections").glob("*.md"))
    assert sorted(sections) == files
    benchmarks = (REPO / "BENCHMARKS.md").read_text()
    for name in sections:
        heading = (REPO / "benchmarks" / "sections" / name).read_text().splitlines()[0]
        assert heading.startswith("## ") and heading in benchmarks.splitlines(), name
    assert (REPO / "benchmarks" / "NOTES.md").read_text().splitlines()[0] in benchmarks.splitlines()


def test_no_section_heading_of_benchmarks_md_lacks_its_file():
    headings = {line for line in (REPO / "BENCHMARKS.md").read_text().splitlines() if line.startswith("## ")}
    sources = [REPO / "benchmarks" / "NOTES.md", *(REPO / "benchmarks" / "sections").glob("*.md")]
    owned = {line for p in sources for line in p.read_text().splitlines() if line.startswith("## ")}
    assert headings <= owned, sorted(headings - owned)
