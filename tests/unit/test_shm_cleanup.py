"""Issue 22, item 12: a trainer killed together with its helpers (a process-group SIGKILL, as Slurm
does: the trainer, its data workers and Python's resource tracker at once) leaves its shared-memory
batch buffer in /dev/shm; the next data-worker pool started on the host removes it, and never a
live trainer's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrain.data.workers import WorkerPool

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this system")

TRAINER = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from hvdtrain.data.workers import WorkerPool
pool = WorkerPool(1)
shm = pool._buffer(1 << 16)  # the batch buffer the first batch creates
print(shm.name, flush=True)
time.sleep(600)
"""


def _start_trainer() -> tuple[subprocess.Popen, Path]:
    """A process that started a worker pool and holds its batch buffer, in its own process group."""
    proc = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    name = proc.stdout.readline().strip()
    assert name, "the trainer did not start"
    return proc, SHM / name


def _kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(0.5)  # the workers and the resource tracker die with the group


def test_segments_of_a_killed_process_group_are_removed_at_the_next_start_and_live_ones_kept():
    dead, dead_segment = _start_trainer()
    live, live_segment = _start_trainer()
    try:
        _kill_group(dead)
        assert dead_segment.exists(), "the group kill was expected to leave the segment behind"
        pool = WorkerPool(1)  # the next start on this host
        try:
            assert not dead_segment.exists(), f"{dead_segment} of a killed trainer is still in /dev/shm"
            assert live_segment.exists(), "a live trainer's segment was removed"
        finally:
            pool.close()
    finally:
        _kill_group(live)
        if live_segment.exists():
            os.unlink(live_segment)  # what this test's own kill left (the next pool would remove it)
