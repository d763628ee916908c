"""The runnable code blocks of README.md and the docs pages, executed as a reader would run them:
each ``bash`` block in ``bash -e``, each ``python`` block as a script, in a fresh folder that holds
only the venv (as ``.venv``) and ``examples/``, with the venv's ``bin`` first on PATH. A block marked
``# not run in CI: ...`` or ``# run in CI by tests/...`` is left to what it names (tests/docsnippets.py
has the convention; tests/unit/test_doc_snippets.py checks the marks and every command's flags)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import docsnippets
from docsnippets import REPO

RUNS: dict[tuple[str, str], docsnippets.Snippet] = {}
for _snippet in docsnippets.every_snippet():
    if _snippet.runs:
        RUNS.setdefault((_snippet.lang, _snippet.text), _snippet)  # a block shown on two pages runs once
SNIPPETS = list(RUNS.values())


def test_the_pages_have_runnable_blocks_of_both_kinds():
    assert {s.lang for s in SNIPPETS} == {"bash", "python"}, [s.where for s in SNIPPETS]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_runnable_block_runs(snippet, tmp_path):
    venv = Path(sys.prefix)
    (tmp_path / ".venv").symlink_to(venv, target_is_directory=True)
    (tmp_path / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    env = {**os.environ, "PATH": os.pathsep.join([str(venv / "bin"), os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    if snippet.lang == "bash":
        command = ["bash", "-e", "-c", snippet.text]
    else:
        (tmp_path / "snippet.py").write_text(snippet.text)
        command = [sys.executable, "snippet.py"]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"{snippet.where} ({snippet.lang}) exited {proc.returncode}:\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
