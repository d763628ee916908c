"""Waiting for a torch collective: hvdtrain's backoff (hvdtrain/torch/waiting.py) against Horovod's
own spin (``HVDTRAIN_TORCH_WAIT=spin``), interleaved.

Real ``horovodrun -np 2 --gloo`` jobs of the image recipe (torch, its small CNN, MNIST digits,
``--samples`` training samples, 1 epoch, no checkpoints), in two settings:

* ``alone``: one job on the machine (each rank has a core where the machine has 2);
* ``side by side``: two jobs started together (4 ranks on 2 cores: what two pytest workers, a
  node shared by two jobs, or decoding workers beside the ranks make).

Each round runs alone-spin, alone-backoff, pair-spin, pair-backoff (the order of the two policies
swapped every other round). Figures per job: wall-clock seconds, CPU-seconds (user + system, the
job's processes only: ``os.wait4``), the epoch's samples/s; medians over rounds and, per round,
backoff / spin.

    python benchmarks/torch_wait.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
POLICIES = ("spin", "backoff")


def start(policy: str, args: argparse.Namespace, out: Path) -> tuple[subprocess.Popen, float]:
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", str(BIN / "hvdtrain"), "recipe",
           "image-classification", "--framework", "torch", "--output", str(out), "--epochs", "1",
           "--set", f"data.max_train_samples={args.samples}", "--set", "data.max_val_samples=64",
           "--set", "checkpoint.enabled=false", "--set", "train.log_every=0", "--set", "train.tensorboard=false"]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO),
           "TF_CPP_MIN_LOG_LEVEL": "2", "HVDTRAIN_TORCH_WAIT": policy}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), time.monotonic()


def finish(proc: subprocess.Popen, started: float, out: Path) -> dict:
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    if status:
        raise SystemExit(f"{proc.args} exited with status {status}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "system_s": usage.ru_stime,
            "samples_per_sec": rows[-1]["samples_per_sec"]}


def run(policy: str, jobs: int, args: argparse.Namespace, root: Path) -> dict:
    """``jobs`` jobs of ``policy`` started together; the mean of their figures."""
    outs = [root / f"{policy}-{jobs}-{i}-{time.monotonic_ns()}" for i in range(jobs)]
    started = [start(policy, args, out) for out in outs]
    results = [finish(proc, t0, out) for (proc, t0), out in zip(started, outs)]
    return {k: statistics.fmean(r[k] for r in results) for k in results[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()
    found: dict[str, dict[str, list[dict]]] = {s: {p: [] for p in POLICIES} for s in ("alone", "side by side")}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = POLICIES if r % 2 == 0 else POLICIES[::-1]
            for setting, jobs in (("alone", 1), ("side by side", 2)):
                for policy in order:
                    found[setting][policy].append(run(policy, jobs, args, Path(tmp)))
                    print(setting, policy, r, {k: round(v, 2) for k, v in found[setting][policy][-1].items()},
                          flush=True)
    summary = {}
    for setting, by_policy in found.items():
        summary[setting] = {p: {k: round(statistics.median(x[k] for x in runs), 2) for k in runs[0]}
                            for p, runs in by_policy.items()}
        summary[setting]["backoff / spin (median of rounds)"] = {
            k: round(statistics.median(b[k] / s[k] for b, s in zip(by_policy["backoff"], by_policy["spin"])), 3)
            for k in by_policy["spin"][0]}
    print(json.dumps({"load_average_before": load_before, "load_average_after": os.getloadavg(),
                      "median": summary, "runs": found}, indent=1))


if __name__ == "__main__":
    main()
