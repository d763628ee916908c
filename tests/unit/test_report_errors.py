"""`hvdtrain report` on folders that are not finished runs: a clear error, non-zero exit, nothing
written. (Real plots of a real run are checked in tests/distributed/test_user_recipes.py.)"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hvdtrain.cli import main
from hvdtrain.reporting import ReportError, render_report

from envguard import CLI_VARIABLES, isolate_environ


@pytest.fixture(autouse=True)
def _cli_environ(monkeypatch):
    isolate_environ(monkeypatch, CLI_VARIABLES)  # the CLI sets TF_CPP_MIN_LOG_LEVEL in this process


@pytest.mark.parametrize("content,needle", [
    (None, "has no metrics.jsonl"),
    ("", "is empty: no epoch finished yet"),
    ('{"epoch": 1}\nnot json\n', "metrics.jsonl:2 is not valid JSON"),
])
def test_not_a_finished_run(tmp_path, content, needle):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(ReportError, match=needle):
        render_report(tmp_path)
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 1 and needle in result.output
    assert not (tmp_path / "report").exists()


def test_missing_directory_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output
