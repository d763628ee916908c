"""Shared helpers: run real `horovodrun` jobs and the `hvdtrain` CLI from tests."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def job_env() -> dict[str, str]:
    """Environment for launched jobs: the venv first on PATH, Open MPI allowed to run as root.

    No ``HOROVOD_*`` variable is inherited: whatever this process (or an earlier test, or the shell)
    has set would silently change every later job (``HOROVOD_AUTOTUNE`` left behind once made elastic
    workers segfault). A test that needs one passes it in :func:`run`'s ``env``, applied on top."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("HOROVOD_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return env


def run(cmd: list[str], timeout: float = 600, check: bool = True, cwd: Path | None = None,
        env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.CompletedProcess:
    """Run a command (extra ``env`` variables on top of :func:`job_env`); on an unexpected exit
    code fail with its output."""
    started, cpu = time.monotonic(), _children_cpu()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env={**job_env(), **(env or {})}, cwd=cwd or REPO, **popen_kwargs)
    _log_job(cmd, time.monotonic() - started, _children_cpu() - cpu)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
                    f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _log_job(cmd: list, wall: float, cpu: float) -> None:
    """With ``HVDTRAIN_TEST_JOB_LOG=FILE``, one JSON line per command a test ran (the test, the
    command, wall and CPU seconds of the command's process tree): where the suite's time goes
    (``python tests/module_seconds.py --jobs FILE`` sums it per test)."""
    log = os.environ.get("HVDTRAIN_TEST_JOB_LOG")
    if log:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
        with open(log, "a") as f:
            f.write(json.dumps({"test": test, "cmd": " ".join(map(str, cmd))[:300], "wall": round(wall, 2),
                                "cpu": round(cpu, 2)}) + "\n")


def horovodrun(args: list[str], np: int = 2, controller: str = "gloo", **kwargs) -> subprocess.CompletedProcess:
    """``horovodrun -np N -H localhost:N --gloo|--mpi ARGS``: a real Horovod job on this host."""
    return run([BIN / "horovodrun", "-np", str(np), "-H", f"localhost:{np}", f"--{controller}", *args], **kwargs)


def worker_pid(rank: int, marker: str, timeout: float = 120) -> int:
    """The pid of the job worker of Horovod rank ``rank`` whose command line contains ``marker``
    (e.g. its unique --output), waiting up to ``timeout`` seconds for it to start."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in cmdline and f"HOROVOD_RANK={rank}".encode() in environ and "horovodrun" not in cmdline:
                return int(entry.name)
        time.sleep(0.2)
    raise AssertionError(f"no worker of rank {rank} with {marker!r} in its command line within {timeout} s")


def hvdtrain_cli() -> str:
    """Path of the installed `hvdtrain` console script."""
    exe = BIN / "hvdtrain"
    return str(exe if exe.exists() else shutil.which("hvdtrain"))


def run_metrics(out: Path) -> list[dict]:
    """The records of ``out/metrics.jsonl``, in order."""
    import json

    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_same_run(a: dict, b: dict, a_out: Path, b_out: Path) -> None:
    """Two runs ended alike, bitwise: the same weights and running statistics (BatchNorm; ``a``,
    ``b``: :func:`checkpoint_weights`) and, epoch by epoch, the same losses, accuracy and step in
    their ``metrics.jsonl``."""
    import numpy as np

    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), f"{key} differs after resume"
    for row_a, row_b in zip(run_metrics(a_out), run_metrics(b_out)):
        for key in ("epoch", "train_loss", "val_loss", "val_accuracy", "step"):
            assert row_a[key] == row_b[key], (key, row_a, row_b)


def assert_own_statistics_kept(checkpoint: Path, ranks: int = 2) -> None:
    """Step checkpoint ``checkpoint`` keeps every rank's own running statistics (BatchNorm) beside
    the model's mean of them, and they differ between the ranks (each rank's own batches): what a
    resume on as many workers continues from (hvdtrain.core.compression_state)."""
    import numpy as np

    from hvdtrain.core.compression_state import BUFFER_KEY, read

    states = read(Path(checkpoint)) or []
    own = [[state[k] for k in sorted(state) if k.startswith(BUFFER_KEY)] for state in states]
    assert len(own) == ranks and all(own), f"{checkpoint}: no per-rank running statistics ({len(own)} ranks)"
    assert any(not np.array_equal(x, y) for x, y in zip(own[0], own[1])), f"{checkpoint}: the ranks' are equal"


def checkpoint_weights(checkpoint: Path, framework: str) -> dict:
    """A checkpoint folder's model weights as NumPy arrays by name (torch ``model.pt`` or Keras ``.npz``)."""
    import numpy as np

    if framework == "torch":
        import torch

        return {k: v.numpy() for k, v in torch.load(Path(checkpoint) / "model.pt", weights_only=True).items()}
    with np.load(Path(checkpoint) / "model_variables.npz") as saved:
        return {k: saved[k] for k in saved.files if k != "paths"}
