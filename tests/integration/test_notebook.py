"""examples/quickstart.ipynb executed end to end by a real Jupyter kernel (nbclient + ipykernel):
hvdtrain.run on 2 workers (built-in recipe, a recipe defined in the notebook, a failing worker),
np=1 in the kernel itself, and the report shown inline. No worker outlives the notebook."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from jobs import REPO

NOTEBOOK = REPO / "examples" / "quickstart.ipynb"


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.distributed
def test_quickstart_notebook_runs_in_a_real_kernel(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    out = tmp_path / "out"
    marker = uuid.uuid4().hex
    monkeypatch.setenv("HVDTRAIN_QUICKSTART_OUTPUT", str(out))
    monkeypatch.setenv("HVDTRAIN_TEST_MARKER", marker)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # the committed notebook keeps the outputs of a whole run (the docs render them, nothing runs at
    # build time): every code cell has some, none is an error; this run starts from none
    stored = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.get("outputs") for c in stored), "store the outputs of a whole run: docs/guides/notebooks.md"
    assert not [o for c in stored for o in c.outputs if o.get("output_type") == "error"]
    for cell in stored:
        cell.outputs, cell.execution_count = [], None

    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises on any cell error

    code = [c for c in notebook.cells if c.cell_type == "code"]
    texts = [_text(c) for c in code]
    everything = "\n".join(texts)
    assert "image-classification" in texts[0]
    assert f"final checkpoint:    {out}/cnn-torch/checkpoints/epoch-0001" in everything
    assert "epoch 2: train_loss" in everything  # the notebook's own recipe, on 2 workers
    failure = next(t for t in texts if "caught WorkerError" in t)
    for needle in ("caught WorkerError from rank 1", "worker 1 of 2", "Traceback from worker 1:",
                   "in build_torch_missing_data", "FileNotFoundError: /data/mnist/shard-1 does not exist"):
        assert needle in failure, failure
    assert "world size: 1" in everything
    assert "image/png" in code[-1].outputs[-1]["data"]

    assert [r["world_size"] for r in _metrics(out / "cnn-torch")] == [2]
    mlp = _metrics(out / "mlp-torch")
    assert [r["epoch"] for r in mlp] == [1, 2] and mlp[-1]["val_accuracy"] > 0.5
    assert [r["world_size"] for r in _metrics(out / "cnn-tensorflow")] == [1]
    assert (out / "mlp-torch" / "report" / "summary.png").stat().st_size > 50_000
    assert any("tfevents" in p.name for p in (out / "mlp-torch").iterdir())

    # the kernel NotebookClient shut down may still be exiting: give it 15 s, no more
    deadline = time.monotonic() + 15
    while (leftovers := _marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers == [], "processes of the notebook's jobs are still running"


def _marked_processes(marker: str) -> list[str]:
    """The processes whose environment holds ``marker`` (the notebook's kernel, jobs and workers)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found
