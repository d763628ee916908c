"""BENCHMARKS.md is generated (benchmarks/report.py): every hand-written section lives in
benchmarks/sections/ and is listed, so a benchmark run never drops one; the file is what its sources
render, a reference under 20 KB whose headline table renders as a table; the dated reports under
reports/ that the references link to exist, and their links land."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPORTS = REPO / "reports"


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


def test_benchmarks_md_is_what_its_sources_render():
    """Edited by hand, it would lose the edit at the next run: the sources are the place."""
    results = json.loads((REPO / "benchmarks" / "results.json").read_text())
    assert (REPO / "BENCHMARKS.md").read_text() == _report().render(results), \
        "BENCHMARKS.md differs from its sources: edit benchmarks/NOTES.md or sections/, then benchmarks/report.py"


def _table_body_rows(text: str) -> list[int]:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    counts, depth = [], None
    for token in tokens:
        if token.type == "table_open":
            counts.append(0)
        elif token.type == "tbody_open":
            depth = True
        elif token.type == "tbody_close":
            depth = None
        elif token.type == "tr_open" and depth:
            counts[-1] += 1
    return counts


@pytest.mark.parametrize("kept", [None, ["3", "4"]])
def test_the_headline_table_renders_as_a_table_with_every_row(kept):
    """Nothing between the table's header and its rows (a prose line there became the table's only row
    and left the real rows as raw pipes)."""
    results = json.loads((REPO / "benchmarks" / "results.json").read_text())
    results["kept_from_earlier"] = kept
    rows = _table_body_rows(_report().render(results))
    assert rows and rows[0] == len(results["rows"]), rows
    committed = _table_body_rows((REPO / "BENCHMARKS.md").read_text())
    assert committed and committed[0] == len(results["rows"]), committed


def test_benchmarks_md_is_a_reference_under_20_kb():
    """What holds now, with its command and date; the dated narratives are reports (reports/benchmarks/)."""
    size = len((REPO / "BENCHMARKS.md").read_bytes())
    assert size < 20_000, f"BENCHMARKS.md is {size} bytes: move the history of a section into its report"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {_slug(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


LINKED = [REPO / "BENCHMARKS.md", REPO / "RELIABILITY.md", *sorted(REPORTS.rglob("*.md"))]


@pytest.mark.parametrize("page", LINKED, ids=lambda p: p.relative_to(REPO).as_posix())
def test_links_of_the_references_and_reports_land(page):
    """Every local link of BENCHMARKS.md, RELIABILITY.md and each report resolves to a file, and an
    anchor to a heading of that file (as GitHub shows them)."""
    broken = []
    for target, anchor in re.findall(r"(?<!!)\]\((?!https?://|mailto:)([^)#\s]*)(#[^)\s]*)?\)", page.read_text()):
        file = (page.parent / target).resolve() if target else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor[1:] not in _anchors(file):
            broken.append(target + anchor)
    assert not broken, f"{page.relative_to(REPO)} links to what does not exist: {broken}"


def test_every_report_is_listed_and_links_back():
    index = (REPORTS / "README.md").read_text()
    for report in sorted(REPORTS.glob("*/*.md")):
        name = report.relative_to(REPORTS).as_posix()
        assert f"]({name})" in index, f"reports/README.md does not list {name}"
        assert "../../BENCHMARKS.md" in report.read_text() or "../../RELIABILITY.md" in report.read_text(), name
