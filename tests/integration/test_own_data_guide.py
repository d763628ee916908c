"""docs/guides/own-data.md runs as written: each of its Python programs (the blocks marked
``# run in CI by`` this file) in a fresh folder, in its own process (torch's and TensorFlow's
Horovod apart), with ``np=1``: the guide's own assertions (train.max_steps, the user's OneCycleLR,
a tf.data pipeline with a CosineDecay optimizer) are the test's, and the program must print a
final metrics row."""

from __future__ import annotations

import ast
import re
import sys

import pytest

from jobs import REPO, run

GUIDE = REPO / "docs" / "guides" / "own-data.md"
MARK = "# run in CI by tests/integration/test_own_data_guide.py"


def programs() -> list[tuple[int, str]]:
    """(line, code) of the guide's Python blocks marked for this test."""
    text = GUIDE.read_text()
    found = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        if match.group(1).startswith(MARK + "\n"):
            found.append((text[:match.start()].count("\n") + 1, match.group(1)))
    return found


def test_the_guide_holds_the_two_programs():
    assert len(programs()) == 2
    frameworks = [("import torch" in code, "import tensorflow" in code) for _, code in programs()]
    assert frameworks == [(True, False), (False, True)]


@pytest.mark.parametrize("line, code", programs(), ids=["torch", "keras"])
def test_a_guide_program_runs_as_written(tmp_path, line, code):
    if "import torch" in code:
        pytest.importorskip("torch")
    else:
        pytest.importorskip("tensorflow")
    script = tmp_path / f"own_data_{line}.py"
    script.write_text(code)
    proc = run([sys.executable, script], cwd=tmp_path, timeout=300)
    last = ast.literal_eval(proc.stdout.strip().splitlines()[-1])  # print(result.history[-1])
    assert last["val_accuracy"] > 0.8, last  # it learned: the label is a linear rule of two features
    assert (tmp_path / "runs").is_dir()
