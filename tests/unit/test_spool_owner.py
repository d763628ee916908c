"""Issue 63, item 12: a stream spool is removed only when its owner is gone in this pid namespace.

Before: ``remove_dead_spools`` read the pid from the folder's name and asked ``os.kill(pid, 0)``, so
a live trainer in another pid namespace (another container with the same host name, sharing the
spool's base folder) looked dead here and its spool was deleted under it. Spool folders are now named
after their owner as shared-memory segments are (``processes.owner_tag``: pid namespace, pid, start
time) and removed by the same test (``processes.owner_gone``). Each owner here is a real process
that made its spool with ``Spool`` and ended without cleaning up (``os._exit``), one of them
recording another pid namespace, as a trainer in another container does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hvdtrain.core import processes
from hvdtrain.data.stream import SPOOL_PREFIX, Spool

OWNER = """
import os, sys
from hvdtrain.core import processes
from hvdtrain.data.stream import Spool
if sys.argv[2] != "here":
    processes._pid_namespace = lambda: sys.argv[2]  # the id a trainer in another container records
spool = Spool([], 1 << 20, 2, sys.argv[1])
print(spool.folder, flush=True)
os._exit(0)  # killed: no atexit clean-up, its folder stays
"""


def left_by_owner(base: Path, namespace: str) -> Path:
    """The spool folder a process that ended without cleaning up left under ``base``."""
    proc = subprocess.run([sys.executable, "-c", OWNER, str(base), namespace], capture_output=True, text=True,
                          timeout=120, check=True)
    folder = Path(proc.stdout.strip())
    assert folder.is_dir() and folder.parent == base, proc
    return folder


def test_a_spool_of_another_pid_namespace_is_kept_and_a_dead_owners_is_removed(tmp_path):
    here = processes.owner_tag().split("-")[0]
    other = str(int(here) + 1) if here.isdigit() else "4026531999"
    elsewhere = left_by_owner(tmp_path, other)  # its pid is no process here: alive in its own namespace
    dead = left_by_owner(tmp_path, "here")
    spool = Spool([], 1 << 20, 2, str(tmp_path))
    try:
        assert elsewhere.is_dir(), "a live trainer's spool in another pid namespace was removed"
        assert not dead.exists()
        assert Path(spool.folder).is_dir()
    finally:
        spool.close()
    assert elsewhere.name.startswith(SPOOL_PREFIX) and f"-{other}-" in elsewhere.name  # the owner's record


def test_a_live_owners_spool_is_kept(tmp_path):
    live = Spool([], 1 << 20, 2, str(tmp_path))
    try:
        assert Path(live.folder).name.startswith(SPOOL_PREFIX) and processes.owner_tag() in live.folder
        other = Spool([], 1 << 20, 2, str(tmp_path))  # the next spool in the same place
        other.close()
        assert Path(live.folder).is_dir()
    finally:
        live.close()
    assert not Path(live.folder).exists() and os.listdir(tmp_path) == []
