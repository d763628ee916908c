"""Issue 63, item 13 (second half): a hostile ``HVDTRAIN_FAULT`` is one line at the point of use.

Before: the variable was parsed when ``hvdtrain.core.faults`` was imported, which every command
does (the CLI imports the checkpoint module), so ``HVDTRAIN_FAULT=bogus hvdtrain recipes`` ended with
a traceback at import. Now it is read when a run starts: a command that trains nothing ignores it,
and a run stops before its first step with one line naming the variable and the allowed forms.
"""

from __future__ import annotations

import subprocess

import pytest
from jobs import hvdtrain_cli, run
from numpy_adapter import register_toy_recipe
from toyrun import fit

from hvdtrain.cli.common import fail

pytestmark = pytest.mark.faults

BOGUS = {"bogus": "HVDTRAIN_FAULT: unknown fault 'bogus'; use KIND[:rank=N][:step=N][:ms=N][:size=N], "
                  "comma-separated, KIND one of: raise, kill, hang",
         "kill:step=soon": "HVDTRAIN_FAULT: bad field 'step=soon' in 'kill:step=soon'; use KIND[:rank=N]"}


@pytest.mark.parametrize("value", BOGUS)
def test_a_command_that_trains_nothing_ignores_it(value):
    proc = run([hvdtrain_cli(), "recipes"], env={"HVDTRAIN_FAULT": value}, check=False, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "image-classification" in proc.stdout


@pytest.mark.parametrize("value", BOGUS)
def test_a_run_stops_before_its_first_step_with_one_line_naming_the_variable(tmp_path, monkeypatch, capsys, value):
    register_toy_recipe()
    monkeypatch.setenv("HVDTRAIN_FAULT", value)
    with pytest.raises(ValueError) as caught:
        fit(tmp_path / "run", "train.epochs=1")
    assert str(caught.value).startswith(BOGUS[value]), caught.value
    assert not (tmp_path / "run" / "checkpoints").is_dir() or not any((tmp_path / "run" / "checkpoints").iterdir())
    monkeypatch.delenv("HVDTRAIN_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        fail(caught.value)  # what every hvdtrain command does with it
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"hvdtrain: error: {BOGUS[value]}")


def test_the_cheapest_training_command_prints_one_line(tmp_path):
    """The real command line: ``hvdtrain recipe`` reaches the run's start and stops there."""
    proc = run([hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--epochs", "1",
                "--output", tmp_path / "run", "--set", "data.max_train_samples=8"],
               env={"HVDTRAIN_FAULT": "bogus"}, check=False, timeout=600)
    assert isinstance(proc, subprocess.CompletedProcess)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"hvdtrain: error: {BOGUS['bogus']}")
