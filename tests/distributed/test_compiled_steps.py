"""``train.compile`` (compiled steps) under real ``horovodrun -np 2 --gloo`` jobs, one per framework
(worker ``compiled_steps.py``): torch.compile (Inductor) in PyTorch, XLA ``jit_compile`` in TensorFlow.

For every gradient exchange (Horovod's allreduce, float16 on the wire with gradient accumulation,
PowerSGD, local SGD, and in torch the sharded optimizer) three updates compiled and three eager
from the same weights agree within float32 rounding (1e-6) (torch's model has dropout: on CPU the
compiled step draws the same masks as the eager one); the ranks hold identical parameters
(local SGD: each rank agrees with its own eager run; the ranks differ between averagings, as
eagerly). With the allreduce: in torch Horovod's gradient hooks start one allreduce per
parameter during the compiled backward (comm.overlap=always), as they do eagerly; the BatchNorm
statistics the compiled step keeps match the eager ones and ``sync_model_buffers`` makes them
equal on the ranks; the checkpoints hold the same keys (no ``_orig_mod.`` prefix) and each kind
of run resumes the other's checkpoint, its next update equal to the original run's; rank 0
reports the compile time once.
"""

import json

import numpy as np
import pytest

from jobs import REPO, horovodrun

WORKER = REPO / "tests" / "distributed" / "workers" / "compiled_steps.py"
EXCHANGES = {"torch": ("allreduce", "fp16_accumulation", "powersgd", "local_sgd", "sharded"),
             "tensorflow": ("allreduce", "fp16_accumulation", "powersgd", "local_sgd")}
PARAMETERS = 6  # two weights and biases, the BatchNorm scale and shift
TOLERANCE = 1e-6


def _gap(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_compiled_steps_match_eager_with_every_exchange_and_resume_each_other(tmp_path, framework):
    report = tmp_path / "report.json"
    proc = horovodrun(["python", WORKER, framework, report, tmp_path / "checkpoints"], timeout=400)
    data = json.loads(report.read_text())
    assert data["world_size"] == 2 and data["parameters"] == PARAMETERS
    compiled_lines = [line for line in proc.stdout.splitlines() if "hvdtrain: compiled the step in" in line]
    what = "torch.compile mode=default" if framework == "torch" else "XLA jit_compile"
    # one line per compiled run (one per exchange, and the one resuming the eager checkpoint), from rank 0 only
    assert len(compiled_lines) == len(EXCHANGES[framework]) + 1 and all(what in line for line in compiled_lines), \
        proc.stdout[-3000:]

    assert tuple(data["runs"]) == EXCHANGES[framework]
    for name, runs in data["runs"].items():
        eager, compiled = runs["none"], runs["default"]
        for step, (e, c) in enumerate(zip(eager["weights"], compiled["weights"])):
            assert _gap(e, c) <= TOLERANCE, f"{framework} {name}: update {step + 1} differs by {_gap(e, c)}"
        assert _gap(eager["weights"][0], eager["weights"][-1]) > 1e-3  # the updates moved the weights
        rank_gap = _gap(*compiled["ranks"])
        if name == "local_sgd":  # three updates, averaging every two: the ranks are apart now, as eagerly
            assert rank_gap > 1e-4 and _gap(*eager["ranks"]) > 1e-4
            for rank in range(2):
                assert _gap(eager["ranks"][rank], compiled["ranks"][rank]) <= TOLERANCE
        else:
            assert rank_gap == 0.0, f"{framework} {name}: the ranks differ by {rank_gap}"

    runs = data["runs"]["allreduce"]
    eager, compiled = runs["none"], runs["default"]
    if framework == "torch":  # every parameter's allreduce started by its hook in the backward pass
        assert eager["started_allreduces"] == compiled["started_allreduces"] == [PARAMETERS] * 3
        assert not any("_orig_mod" in key for key in compiled["saved_keys"])
    assert compiled["saved_keys"] == eager["saved_keys"]
    assert _gap(eager["buffers_local"][0], compiled["buffers_local"][0]) <= TOLERANCE  # BatchNorm statistics
    assert compiled["buffers_local"][0] != compiled["buffers_local"][1]  # each rank saw its own batches
    for kind in (eager, compiled):
        assert kind["buffers"][0] == kind["buffers"][1]  # ... until sync_model_buffers averaged them
    for kind in ("none", "default"):  # resumed by the other kind of run: the same next update
        gap = _gap(runs[kind]["continued"], runs[kind]["resumed_by_other"])
        assert gap <= TOLERANCE, f"{framework}: the {kind} run's checkpoint resumed by the other differs by {gap}"
