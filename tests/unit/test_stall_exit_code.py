"""Issue 63, item 1: a stall has an exit code of its own, which the requeue template treats as a failure.

Before: the stall watchdog exited 75, the preemption's code, so ``examples/slurm/requeue.sbatch``
printed "stopped at a checkpoint (exit 75): back to the queue" and ran ``scontrol requeue`` for a
run that hung before any checkpoint (it would hang again, in the queue for ever). The template runs
here as written, under bash, with ``srun`` and ``scontrol`` stand-ins on ``PATH`` that record
their calls (the real cluster runs it in tests/slurm/test_slurm.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hvdtrain.core.preemption import EXIT_PREEMPTED
from hvdtrain.core.watchdog import STALL_EXIT_CODE

TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "requeue.sbatch"


def run_template(tmp_path: Path, status: int) -> tuple[subprocess.CompletedProcess, str]:
    """The template's run whose ``srun`` exits ``status``; returns it and the ``scontrol`` calls."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/sh\nexit {status}\n")
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]"}
    proc = subprocess.run(["bash", str(TEMPLATE)], env=env, capture_output=True, text=True, timeout=60)
    return proc, calls.read_text() if calls.exists() else ""


def test_a_stall_has_its_own_exit_code():
    assert STALL_EXIT_CODE != EXIT_PREEMPTED and STALL_EXIT_CODE not in (0, 1, 2)


def test_the_requeue_template_does_not_requeue_a_stall(tmp_path):
    proc, calls = run_template(tmp_path, STALL_EXIT_CODE)
    assert proc.returncode == STALL_EXIT_CODE, proc.stderr
    assert calls == "", calls  # no scontrol requeue
    assert "back to the queue" not in proc.stdout
    assert f"stalled (exit {STALL_EXIT_CODE}, train.stall_timeout_sec): a failure, not requeued" in proc.stdout


@pytest.mark.parametrize("status", [EXIT_PREEMPTED, 1, 0])
def test_the_requeue_template_requeues_on_the_preemption_code_only(tmp_path, status):
    proc, calls = run_template(tmp_path, status)
    assert proc.returncode == status, proc.stderr
    assert calls == ("requeue 4242\n" if status == EXIT_PREEMPTED else ""), calls
