"""Start-up of one `horovodrun` launch: Horovod's build check importing torch first (what
scripts/install.sh sets) against TensorFlow first (Horovod's own order), interleaved.

Every `horovodrun` asks whether Gloo (or MPI) was built by importing one framework extension in a
forked process; the order of ``horovod.common.util.EXTENSIONS`` decides which. This times
``horovodrun -np 2 -H localhost:2 --gloo true`` (no training: the launch alone) ROUNDS times in
turn with each order and prints the median wall seconds and their ratio::

    .venv/bin/python benchmarks/launch_startup.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

LAUNCH = ["-np", "2", "-H", "localhost:2", "--gloo", "true"]
ORDERS = {"torch first (install.sh)": "torch,tensorflow,mxnet", "tensorflow first (Horovod)": "tensorflow,torch,mxnet"}
RUNNER = """import sys
import horovod.common.util as util
util.EXTENSIONS[:] = sys.argv[1].split(",")
from horovod.runner.launch import run_commandline
sys.argv = ["horovodrun", *sys.argv[2:]]
sys.exit(run_commandline())
"""


def launch(order: str) -> float:
    """Wall seconds of one launch with the build check importing the extensions in ``order``."""
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", RUNNER, order, *LAUNCH], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for order in ORDERS.values():  # warm-up: the page cache holds both frameworks afterwards
        launch(order)
    times: dict[str, list[float]] = {name: [] for name in ORDERS}
    ratios = []
    for _ in range(rounds):
        pair = {name: launch(order) for name, order in ORDERS.items()}
        for name, seconds in pair.items():
            times[name].append(seconds)
        first, second = pair.values()
        ratios.append(first / second)
    for name, values in times.items():
        print(f"{name:28s} median {statistics.median(values):.3f} s  (min {min(values):.3f}, max {max(values):.3f})")
    print(f"ratio torch-first / tensorflow-first, median of {rounds} interleaved pairs: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
