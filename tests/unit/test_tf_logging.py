"""hvdtrain.tools.tf_logging: TensorFlow's start-up lines are dropped, every other line written to
standard error while TensorFlow loads still shows (in order), and a user's TF_CPP_MIN_LOG_LEVEL is
theirs. A real process writes to file descriptor 2 (as TensorFlow's C++ libraries do); no
TensorFlow here: a real TensorFlow run through the CLI is tests/distributed/test_early_stopping.py."""

from __future__ import annotations

import subprocess
import sys

from hvdtrain.tools import tf_logging

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795518326.360586   26224 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. To turn "
    "them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795518369.539489   26632 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
    "appropriate compiler flags.",
]
REAL = ["W0000 00:00:1795518369.1   26632 cpu_allocator_impl.cc:83] Allocation of 1073741824 exceeds 10% of free "
        "system memory.", "UserWarning: a real Python warning"]

SCRIPT = """
import os, sys
from hvdtrain.tools import tf_logging
lines = sys.argv[1:]
def emit():
    for line in lines:
        os.write(2, (line + "\\n").encode())
with tf_logging.filtered_stderr():
    emit()
if os.environ.get("RAISE"):
    try:
        with tf_logging.filtered_stderr():
            emit()
            raise ImportError("boom")
    except ImportError:
        pass
print("done", file=sys.stderr)
"""


def run(*env_pairs: str) -> str:
    env = dict(pair.split("=", 1) for pair in env_pairs)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *NOISE[:2], REAL[0], *NOISE[2:], REAL[1]],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}, check=True,
                          cwd=str(__import__("pathlib").Path(tf_logging.__file__).parents[2]))
    return proc.stderr


def test_start_up_lines_are_dropped_and_every_other_line_kept_in_order():
    assert run().splitlines() == [*REAL, "done"]


def test_a_failed_import_writes_everything_back():
    lines = run("RAISE=1").splitlines()
    assert lines == [*REAL, *NOISE[:2], REAL[0], *NOISE[2:], REAL[1], "done"]


def test_the_users_level_is_theirs_and_hvdtrains_default_is_recognised():
    assert tf_logging.user_level({}) is None
    assert tf_logging.user_level({"TF_CPP_MIN_LOG_LEVEL": "0"}) == "0"
    # a child process that inherited hvdtrain's default is still quieted
    assert tf_logging.user_level({"TF_CPP_MIN_LOG_LEVEL": "1", "HVDTRAIN_TF_LOG_DEFAULT": "1"}) is None
    assert tf_logging.user_level({"TF_CPP_MIN_LOG_LEVEL": "3", "HVDTRAIN_TF_LOG_DEFAULT": "1"}) == "3"
    assert all(tf_logging.is_noise(line) for line in NOISE) and not any(tf_logging.is_noise(r) for r in REAL)
