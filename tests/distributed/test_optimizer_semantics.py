"""issue 10, item 6: optimizer details, under real `horovodrun -np 2 --gloo`, both frameworks.

* The first updates through the adapter (Horovod's DistributedOptimizer / gradient tape, the
  state broadcast before training) equal those of one process running the plain optimizer on
  the concatenated global batch: Adam's first update is not shrunk by Horovod's state-creating
  dummy step, and coupled weight decay does not seed the moments.
* torch and TensorFlow take the same updates for the same config and weights (SGD with momentum
  and coupled weight decay, Adam, AdamW with decoupled decay; no decay on the bias), with the LR
  changing every update.
* Gradient accumulation with a short window equals one step on that window's concatenated batch.
"""

import json

import numpy as np
import pytest

from jobs import REPO, horovodrun

WORKER = REPO / "tests" / "distributed" / "workers" / "first_updates.py"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for framework in ("torch", "tensorflow"):
        path = tmp_path_factory.mktemp(framework) / "report.json"
        horovodrun(["python", WORKER, framework, path], timeout=300)
        out[framework] = json.loads(path.read_text())
        assert out[framework]["world_size"] == 2
    return out


def _close(actual, expected, rtol, atol):
    for step, (a, e) in enumerate(zip(actual, expected)):
        for got, want in zip(a, e):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol,
                                       err_msg=f"after update {step + 1}")


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "accumulation"])
def test_torch_adapter_equals_one_process_on_the_global_batch(reports, name):
    report = reports["torch"]
    _close(report["adapter"][name], report["reference"][name], rtol=1e-5, atol=1e-6)


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "accumulation"])
def test_tensorflow_takes_the_same_updates_as_torch(reports, name):
    # float32 rounding only: the Keras optimizers take torch's formulas (hvdtrain/tensorflow/adapter.py)
    _close(reports["tensorflow"]["adapter"][name], reports["torch"]["reference"][name], rtol=2e-5, atol=2e-6)


@pytest.mark.distributed
def test_tensorflow_update_step_leaves_the_set_learning_rate_in_the_optimizer_and_returns_a_numpy_loss(reports):
    # set_learning_rate only records the LR; the update's traced step assigns it (no eager op per step)
    report = reports["tensorflow"]
    assert set(report["optimizer_lr"]) == {"sgd", "adam", "adamw"}
    for name, pairs in report["optimizer_lr"].items():
        assert [got for _, got in pairs] == [float(np.float32(lr)) for lr, _ in pairs], name
    # an update step has read its result (the finite check): its loss comes back as a NumPy scalar
    assert set(report["loss_types"]) == {"numpy.float32"}
