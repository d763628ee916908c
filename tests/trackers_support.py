"""The real trackers for tests: an MLflow tracking server on loopback, W&B offline run files read back.

:func:`mlflow_server` starts ``mlflow server`` (``scripts/mlflow-server.sh``: the full server package
in its own venv, ``.venv-mlflow``, installed by the script on first use) on a free loopback port
with a SQLite backend and served artifacts in a temporary folder, and stops it afterwards. Tests
read runs back through MLflow's own client (``mlflow-skinny`` in the training venv).

:func:`wandb_runs` reads every ``.wandb`` file under a folder with W&B's own protobufs: the file is a
LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of records of type full, first,
middle or last), each record a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
SERVER_SCRIPT = REPO / "scripts" / "mlflow-server.sh"
START_TIMEOUT_SEC = 300  # a cold venv install is done by the script before the server starts


def free_port() -> int:
    """A TCP port nobody listens on now (loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """A running MLflow tracking server (SQLite and artifacts under ``root``); yields its URI."""
    subprocess.run([str(SERVER_SCRIPT), "--setup"], check=True, timeout=900)  # the server's venv, once
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = open(root / "server.log", "w")
    proc = subprocess.Popen([str(SERVER_SCRIPT), "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
                             "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, cwd=root,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_SEC
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start (exit {proc.poll()}):\n"
                                   + (root / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield uri
    finally:
        import os
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the script exec'd mlflow, which starts uvicorn workers
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


# -- W&B offline run files --------------------------------------------------------------------------
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> Iterator[Any]:
    """The ``Record`` protobufs of one ``.wandb`` file, in order (a torn tail is ignored)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == FULL:
            pending, whole = b"", chunk
        elif kind == FIRST:
            pending, whole = chunk, None
        elif kind == MIDDLE:
            pending, whole = pending + chunk, None
        else:
            pending, whole = b"", pending + chunk
        if whole is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(whole)
            yield record


def wandb_runs(folder: Path) -> dict[str, dict[str, Any]]:
    """Every W&B run whose files lie under ``folder``: run id -> ``{"files": [...], "history":
    [{key: value, ...}, ...], "config": {key: value}}`` (history rows in the order logged, across
    the run's resumed pieces)."""
    runs: dict[str, dict[str, Any]] = {}
    for path in sorted({p.resolve() for p in Path(folder).rglob("*.wandb")}):  # latest-run is a link
        run_id = None
        for record in wandb_records(path):
            which = record.WhichOneof("record_type")
            if which == "run":
                run_id = record.run.run_id
                entry = runs.setdefault(run_id, {"files": [], "history": [], "config": {}})
                if path not in entry["files"]:
                    entry["files"].append(path)
                for item in record.run.config.update:
                    entry["config"][item.key] = json.loads(item.value_json)
            elif which == "history" and run_id is not None:
                runs[run_id]["history"].append(
                    {("/".join(i.nested_key) if i.nested_key else i.key): json.loads(i.value_json)
                     for i in record.history.item})
            elif which == "config" and run_id is not None:
                for item in record.config.update:
                    runs[run_id]["config"][item.key] = json.loads(item.value_json)
    return runs


def mlflow_history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    """``[(step, value), ...]`` of one metric of an MLflow run, in step order."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
