"""The cost of a fixed global batch and of bitwise mode against plain data parallelism (issue 42),
interleaved: real ``horovodrun -np N`` jobs (``--np``, default 2) of the image recipe (ResNet-18,
BatchNorm throughout, MNIST digits at ``--image-size`` pixels), run in turn A, B, C, A, B, C, ...:

* ``plain``: ``--batch-size B`` per worker (the global batch is N x B);
* ``fixed``: ``train.global_batch_size=NB`` in micro-batches of B (the same arithmetic at N workers:
  what the dealing of global batches costs);
* ``bitwise``: the same plus ``train.reproducible=world-size``.

Each job trains ``--epochs`` epochs without validation or checkpoints; the figures are the last
epoch's ``samples_per_sec`` (wall clock) and the jobs' CPU-seconds per 1,000 samples trained (all
processes of the job, user + system: what load from other processes distorts least), median over
rounds. Peak memory: the largest resident set of one process of the job (``os.wait4``'s
``ru_maxrss``, the job's own processes only).

    python benchmarks/world_size.py --framework torch --rounds 2
    python benchmarks/world_size.py --framework torch --rounds 2 --np 4
    python benchmarks/world_size.py --framework tensorflow --rounds 2
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


def job(mode: str, args: argparse.Namespace, out: Path) -> dict:
    b = args.batch_size
    n = args.np
    keys = {"plain": [], "fixed": [f"train.global_batch_size={n * b}"],
            "bitwise": [f"train.global_batch_size={n * b}", "train.reproducible=world-size"]}[mode]
    cmd = [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo", str(BIN / "hvdtrain"), "recipe",
           "image-classification", "--framework", args.framework, "--output", str(out), "--epochs", str(args.epochs),
           "--batch-size", str(b), "--set", "model.name=resnet18", "--set", f"data.image_size={args.image_size}",
           "--set", f"data.max_train_samples={args.samples}", "--set", "data.max_val_samples=32",
           "--set", "checkpoint.enabled=false", "--set", "train.log_every=0", "--set", "train.tensorboard=false",
           *[x for key in keys for x in ("--set", key)]]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)  # this job's processes only: CPU time and the largest RSS
    if status:
        raise SystemExit(f"{mode}: {' '.join(cmd)} exited with status {status}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    cpu = usage.ru_utime + usage.ru_stime
    return {"samples_per_sec": rows[-1]["samples_per_sec"], "cpu_s_per_1k": 1000 * cpu / (args.samples * args.epochs),
            "wall_s": time.monotonic() - started, "maxrss_mib": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", default="torch", choices=("torch", "tensorflow"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--np", type=int, default=2, help="workers of every job (4 on 2 cores: oversubscribed)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1024)
    args = parser.parse_args()
    found: dict[str, list[dict]] = {"plain": [], "fixed": [], "bitwise": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in found:
                found[mode].append(job(mode, args, Path(tmp) / f"{mode}{r}"))
                print(mode, r, found[mode][-1], flush=True)
    summary = {mode: {k: statistics.median(run[k] for run in runs) for k in runs[0]} for mode, runs in found.items()}
    print(json.dumps({"load_average": os.getloadavg(), "median": summary, "runs": found}, indent=1))


if __name__ == "__main__":
    main()
