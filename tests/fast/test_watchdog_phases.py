"""Issue 22, item 12: phases that legitimately make no progress for longer than the stall timeout
(a cold index build inside the recipe's builder, rank 0 verifying checkpoints on a slow disk, an
elastic join) announce themselves, and the stall watchdog leaves a healthy job alone.

The watchdog ends its process with ``os._exit``, so each scenario runs the real Trainer (NumPy
adapter) in a child process with ``train.stall_timeout_sec=1``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from hvdtrain.core.watchdog import STALL_EXIT_CODE

HERE = Path(__file__).resolve().parent
PRELUDE = f"""
import sys, time
sys.path[:0] = [{str(HERE)!r}, {str(HERE.parents[1])!r}]
from numpy_adapter import RECIPE, register_toy_recipe
from toyrun import fit
from hvdtrain.core.registry import get_builder, register_recipe
register_toy_recipe()
"""


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=120)


def test_a_slow_recipe_builder_such_as_a_cold_index_build_is_not_a_stall(tmp_path):
    proc = _run(f"""
        toy = get_builder(RECIPE, "torch")

        @register_recipe(RECIPE, framework="torch", replace=True)
        def build(config, ctx):
            time.sleep(2.0)  # a cold image-index build: no step, no beat
            return toy(config, ctx)

        fit({str(tmp_path)!r}, "train.epochs=1", "train.stall_timeout_sec=1")
        print("trained")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trained" in proc.stdout


def test_rank_0_verifying_checkpoints_on_a_slow_disk_is_not_a_stall(tmp_path):
    proc = _run(f"""
        fit({str(tmp_path)!r}, "train.epochs=1")
        from hvdtrain.core import checkpoint
        real = checkpoint.sha256_file

        def slow_disk(path):
            if "epoch-0001" in str(path):  # verifying the saved checkpoint (writes stay fast)
                time.sleep(0.7)  # three payload files: 2 s of checksums, the timeout is 1 s
            return real(path)

        checkpoint.sha256_file = slow_disk
        fit({str(tmp_path)!r}, "train.epochs=2", "checkpoint.resume=true", "train.stall_timeout_sec=1")
        print("resumed")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resumed" in proc.stdout


def test_a_phase_with_a_limit_that_overruns_is_a_stall_naming_the_phase():
    proc = _run("""
        from hvdtrain.core import watchdog
        with watchdog.StallWatchdog(1.0, rank=3) as dog:
            dog.beat(7, "building the recipe's model and data")
            with watchdog.phase("building the image index", limit=1.0):
                time.sleep(5)
        print("not reached")
    """)
    assert proc.returncode == STALL_EXIT_CODE
    assert "rank 3" in proc.stderr and "phase: building the image index" in proc.stderr
    assert "not reached" not in proc.stdout
