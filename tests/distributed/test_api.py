"""hvdtrain.run from Python: a worker that fails in the middle of training (its peer waiting in an
allreduce) reaches the caller as a WorkerError with that worker's traceback, every worker is gone
afterwards, and the caller's Ctrl-C handler is back. (The success path, results and np=1 run in
the quickstart notebook test.)"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import uuid

import pytest

from jobs import REPO, run

SCRIPT = textwrap.dedent('''
    import json, signal, sys, time
    import hvdtrain

    hvdtrain.define_recipe("failing-cnn", replace=True)


    @hvdtrain.register_recipe("failing-cnn", framework="torch", replace=True)
    def build(config, ctx):
        from recipes.image_classification import build_torch

        task = build_torch(config, ctx)
        calls, real_loss = [0], task.loss_fn

        def failing_loss(logits, labels):
            calls[0] += 1
            if ctx.rank == 1 and calls[0] == 3:
                raise ArithmeticError("loss exploded on rank 1 at its third batch")
            return real_loss(logits, labels)

        task.loss_fn = failing_loss
        return task


    if __name__ == "__main__":
        started = time.time()
        try:
            hvdtrain.run("failing-cnn", framework="torch", np=2, output=sys.argv[1], train__epochs=1,
                         train__batch_size=16, data__max_train_samples=256, data__max_val_samples=64)
        except hvdtrain.WorkerError as err:
            print("REPORT " + json.dumps({
                "rank": err.rank, "type": err.exc_type, "message": err.message, "text": str(err),
                "original": repr(err.exception), "seconds": time.time() - started,
                "sigint_restored": signal.getsignal(signal.SIGINT) is signal.default_int_handler}))
''')


def _processes_with(marker: str) -> list[str]:
    """Command lines of live processes whose environment holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        found.append(c.read().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


@pytest.mark.distributed
def test_worker_failure_reaches_the_caller_with_its_traceback(tmp_path, monkeypatch):
    script = tmp_path / "notebook_like.py"
    script.write_text(SCRIPT)
    marker = f"HVDTRAIN_TEST_MARKER={uuid.uuid4().hex}"
    monkeypatch.setenv(*marker.split("="))
    proc = run([sys.executable, script, tmp_path / "out"], timeout=300, cwd=REPO)
    report = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))[7:])
    assert report["rank"] == 1 and report["type"] == "ArithmeticError"
    assert report["message"] == "loss exploded on rank 1 at its third batch"
    assert report["original"] == "ArithmeticError('loss exploded on rank 1 at its third batch')"
    text = report["text"]
    assert text.startswith("worker 1 of 2 ")
    assert "Traceback from worker 1:" in text
    for frame in ("in train_step", "in failing_loss", 'raise ArithmeticError("loss exploded'):
        assert frame in text, text
    assert report["sigint_restored"]
    assert report["seconds"] < 240
    assert _processes_with(marker) == []  # no worker outlived the call
