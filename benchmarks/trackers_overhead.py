"""What the experiment trackers cost: samples/s with ``log.trackers=tensorboard,mlflow,wandb``
against ``tensorboard`` alone, in interleaved 2-rank jobs (A B, B A, A B, ...) on the same data.

Each round runs the image-classification recipe (torch, small CNN, MNIST, ``horovodrun -np 2
--gloo``) once with TensorBoard only (A) and once with TensorBoard, MLflow (a real server on loopback
started from scripts/mlflow-server.sh, SQLite backend) and W&B offline (B), ``train.log_every=5``
(ten times the default's step logging). It reads the last epoch's ``samples_per_sec`` from each
job's metrics.jsonl (the first epoch holds the warm-up) and prints the median of each and of the
per-round ratios B/A::

    .venv/bin/python benchmarks/trackers_overhead.py [ROUNDS] [FRAMEWORK] [LOG_EVERY (default 5)]

On a busy machine the jobs' rates vary by several percent from run to run; ``--calls`` measures
instead what rank 0 spends inside the trackers' callback, in-process (no training): the wall time
of one logged step (MLflow and W&B together) and of one epoch's log, from which the overhead at
any ``train.log_every`` and step time follows::

    .venv/bin/python benchmarks/trackers_overhead.py --calls [N]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from trackers_support import mlflow_server  # noqa: E402

BIN = Path(sys.executable).parent
JOB = ["--epochs", "2", "--batch-size", "32", "--set", "data.max_train_samples=6144", "--set",
       "data.max_val_samples=512", "--set", "checkpoint.enabled=false"]
LOG_EVERY = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[1] != "--calls" else 5  # train.log_every


def job(framework: str, output: Path, trackers: str, env: dict[str, str]) -> float:
    """Last epoch's samples/s of one 2-rank job."""
    subprocess.run([BIN / "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", BIN / "hvdtrain", "recipe",
                    "image-classification", "--framework", framework, "--output", output, *JOB,
                    "--set", f"train.log_every={LOG_EVERY}",
                    "--set", f"log.trackers={trackers}"], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows[-1]["samples_per_sec"]


def calls(n: int, gap: float = 0.02) -> None:
    """Rank 0's wall time inside :class:`TrackersCallback` per logged step (``n`` steps, ``gap``
    seconds of "training" between them, as ``train.log_every`` steps would take) and per epoch, for
    MLflow alone, W&B offline alone and both."""
    import time

    from hvdtrain.core.adapter import DistContext
    from hvdtrain.core.config import load_config
    from hvdtrain.observability.trackers import TrackersCallback

    os.environ.update(MLFLOW_DISABLE_TELEMETRY="true", WANDB_MODE="offline", WANDB_SILENT="true")
    with tempfile.TemporaryDirectory() as tmp, mlflow_server(Path(tmp) / "mlflow") as uri:
        for trackers in ("mlflow", "wandb", "mlflow,wandb"):
            output = Path(tmp) / f"run-{trackers.replace(',', '-')}"
            output.mkdir()
            config = load_config(None, overrides=["recipe=image-classification", "framework=torch",
                                                  f"output={output}", f"log.trackers={trackers}",
                                                  f"log.mlflow_tracking_uri={uri}", "train.log_every=1"])
            callback = TrackersCallback(config)
            callback.on_train_begin(DistContext(), {"config": config, "output": output, "start_epoch": 0,
                                                    "steps_per_epoch": n, "world_size": 2})
            inside = 0.0
            for step in range(n):
                time.sleep(gap)
                started = time.perf_counter()
                callback.on_step_end(0, step, {"loss": 0.5, "lr": 0.1, "samples_per_sec": 1000.0,
                                               "global_step": step + 1})
                inside += time.perf_counter() - started
            epochs = []
            for epoch in range(10):
                time.sleep(gap)
                started = time.perf_counter()
                callback.on_epoch_end(epoch, {"epoch": epoch + 1, "train_loss": 0.4, "val_loss": 0.3,
                                              "val_accuracy": 0.9, "samples_per_sec": 1000.0,
                                              "epoch_time_sec": 10.0, "lr": 0.1, "step": n})
                epochs.append(time.perf_counter() - started)
            started = time.perf_counter()
            callback.on_train_end(None)
            closing = time.perf_counter() - started
            print(f"{trackers}: {inside / n * 1e3:.2f} ms per logged step ({n} steps, {gap * 1e3:.0f} ms apart), "
                  f"{statistics.median(epochs) * 1e3:.1f} ms per epoch (median of 10), {closing:.2f} s to close; "
                  f"at train.log_every=50: {inside / n / 50 * 1e3:.3f} ms per training step", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--calls"]:
        calls(int(sys.argv[2]) if len(sys.argv) > 2 else 300)
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    framework = sys.argv[2] if len(sys.argv) > 2 else "torch"
    with tempfile.TemporaryDirectory() as tmp, mlflow_server(Path(tmp) / "mlflow") as uri:
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMPI_ALLOW_RUN_AS_ROOT": "1",
               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "MLFLOW_TRACKING_URI": uri,
               "MLFLOW_DISABLE_TELEMETRY": "true", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
               "WANDB_CONFIG_DIR": f"{tmp}/wandb-config", "WANDB_CACHE_DIR": f"{tmp}/wandb-cache"}
        a, b = [], []
        for n in range(rounds):
            first_b = n % 2 == 1  # A B, B A, A B, ...: neither always runs first
            if first_b:
                b.append(job(framework, Path(tmp) / f"b{n}", "tensorboard,mlflow,wandb", env))
            a.append(job(framework, Path(tmp) / f"a{n}", "tensorboard", env))
            if not first_b:
                b.append(job(framework, Path(tmp) / f"b{n}", "tensorboard,mlflow,wandb", env))
            print(f"round {n + 1}: tensorboard {a[-1]:.0f} samples/s, tensorboard+mlflow+wandb {b[-1]:.0f} "
                  f"samples/s, ratio {b[-1] / a[-1]:.3f}", flush=True)
    ratios = [y / x for x, y in zip(a, b)]
    print(f"{framework}, 2 ranks, {rounds} interleaved rounds: tensorboard median {statistics.median(a):.0f} samples/s, "
          f"tensorboard+mlflow+wandb median {statistics.median(b):.0f} samples/s; ratio median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), "
          f"ratio of medians {statistics.median(b) / statistics.median(a):.3f}")


if __name__ == "__main__":
    main()
