"""PowerSGD, top-k and local SGD under real `horovodrun -np 2` jobs (Gloo and MPI), both frameworks.

* exact properties on seeded gradients (worker ``compression_props.py``): error feedback keeps
  applied + mean residual equal to the sum of the true mean gradients; PowerSGD at full rank and
  top-k with k = all equal plain averaging (1e-5 / 1e-6); the warm-up steps are plain averages;
  every rank applies the same update; torch and TensorFlow give the same updates (1e-5);
* short training runs that learn, with the ranks' parameters compared after every step
  (worker ``compression_train.py``): identical after every averaging (always, for PowerSGD and
  top-k), different between averagings for local SGD;
* ``comm.local_sgd_steps=1`` is synchronous SGD, bitwise.
"""

import json

import numpy as np
import pytest

from jobs import REPO, horovodrun

WORKERS = REPO / "tests" / "distributed" / "workers"
TRAIN = ["train.epochs=1", "train.batch_size=32", "data.max_train_samples=3072", "data.max_val_samples=500",
         "train.log_every=0", "train.threads=1", "checkpoint.enabled=false", "train.tensorboard=false",
         "train.progress_bar=false"]


def props(tmp_path, framework, controller="gloo"):
    out = tmp_path / f"{framework}.npz"
    proc = horovodrun(["python", WORKERS / "compression_props.py", framework, out], controller=controller,
                      timeout=300)
    assert "compression properties hold" in proc.stdout
    return np.load(out)


@pytest.mark.distributed
def test_exact_properties_in_both_frameworks_and_same_updates(tmp_path):
    torch_updates, tf_updates = props(tmp_path, "torch"), props(tmp_path, "tensorflow", controller="mpi")
    assert sorted(torch_updates.files) == sorted(tf_updates.files)
    for key in torch_updates.files:
        if "fp16" in key:  # float16 rounding of different partial sums may differ by one unit
            continue
        gap = float(np.max(np.abs(torch_updates[key] - tf_updates[key])))
        assert gap <= 1e-5, f"{key}: torch and TensorFlow updates differ by {gap}"


def train(tmp_path, framework, controller, *overrides):
    report = tmp_path / "report.json"
    horovodrun(["python", WORKERS / "compression_train.py", report, framework, f"output={tmp_path / 'run'}",
                *TRAIN, *overrides], controller=controller, timeout=400)
    return json.loads(report.read_text())


@pytest.mark.distributed
@pytest.mark.parametrize("framework, controller, overrides", [
    # each option once, both frameworks and both controllers among them (CI time)
    ("torch", "gloo", ["comm.compression=powersgd", "comm.powersgd_rank=4", "comm.powersgd_start_step=10"]),
    ("tensorflow", "mpi", ["comm.compression=topk", "comm.topk_ratio=0.01", "train.fp16_allreduce=true"]),
    ("tensorflow", "gloo", ["comm.local_sgd_steps=4", "comm.local_sgd_average_optimizer=true"]),
])
def test_short_runs_learn_with_replicas_in_sync(tmp_path, framework, controller, overrides):
    data = train(tmp_path, framework, controller, *overrides)
    assert data["world_size"] == 2
    assert data["history"][-1]["val_accuracy"] >= 0.7, data["history"]  # chance: 0.1
    assert data["synced_steps"] > 0 and data["synced_mismatches"] == 0, data
    assert data["final_fingerprints"][0] == data["final_fingerprints"][1]
    if any(o.startswith("comm.local_sgd_steps") for o in overrides):
        assert data["local_steps"] > 0 and data["local_differ"] == data["local_steps"], data
        assert data["synced_steps"] >= data["local_steps"] / 3 - 1, data  # averaged every 4th step
    else:
        assert data["local_steps"] == 0, data


@pytest.mark.distributed
def test_local_sgd_one_step_is_synchronous_sgd_bitwise(tmp_path):
    few = "data.max_train_samples=512"  # no accuracy to reach here: bitwise equality over 8 steps
    sync = train(tmp_path / "sync", "torch", "gloo", few)
    local = train(tmp_path / "local", "torch", "gloo", few, "comm.local_sgd_steps=1")
    assert sync["final_fingerprints"] == local["final_fingerprints"]
    assert sync["history"][-1]["val_loss"] == local["history"][-1]["val_loss"]
