"""hvdtrain.core.quick_exit: the exit handler load_adapter installs collects, then freezes, and runs
after the handlers registered later (the framework's), which all still run."""

import subprocess
import sys

from jobs import REPO

SCRIPT = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at the end:", gc.get_freeze_count() > 0, flush=True))
from hvdtrain.core import quick_exit
quick_exit.install(); quick_exit.install()  # once per process

class Cycle:
    def __del__(self):
        open(sys.argv[1], "w").write("finalized")

def later_handler():  # registered after install, as a framework's: runs first, leaves a cycle behind
    a = Cycle(); a.me = a
    print("frozen in a later handler:", gc.get_freeze_count() > 0, flush=True)
atexit.register(later_handler)
"""


def test_collects_then_freezes_after_later_handlers(tmp_path):
    marker = tmp_path / "finalized.txt"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(marker)], capture_output=True, text=True, cwd=REPO,
                          timeout=60, check=True)
    assert proc.stdout.splitlines() == ["frozen in a later handler: False", "frozen at the end: True"], proc.stdout
    assert marker.read_text() == "finalized"  # the cycle left by a handler was collected, its finalizer ran
