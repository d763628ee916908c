"""issue 39, item 3, under real `horovodrun -np 2 --gloo`: Keras 3 ``model.fit`` through hvdtrain.keras
(examples/keras_fit.py: AdamW with a warmed-up CosineDecay, the gradients averaged by
``DistributedOptimizer``, the initial broadcast, metric averaging, rank-0 checkpoints). Two jobs:

1. the worker (tests/distributed/workers/keras_fit.py) runs the example uninterrupted for 3 epochs,
   then again into another folder, SIGKILLed on every rank after epoch 1's checkpoint;
2. the example script itself, ``--resume`` on the killed run's folder.

Checked: the run learns (the loss falls, validation accuracy well above chance), both ranks end
with the same model and optimizer variables and the same averaged metrics, the optimizer counted
one iteration per step, a custom ``tf.GradientTape`` loop through ``DistributedOptimizer.apply``
(eager and traced, different data per rank) ends with the same weights on both ranks, and the
resumed run's last checkpoint holds the uninterrupted run's variables bit for bit.
"""

import json

import numpy as np
import pytest

from jobs import REPO, horovodrun

WORKER = REPO / "tests" / "distributed" / "workers" / "keras_fit.py"
EXAMPLE = REPO / "examples" / "keras_fit.py"
ARGS = ["--limit", "1024", "--epochs", "3", "--batch-size", "32", "--warmup-steps", "8"]
STEPS = 1024 // 2 // 32


def arrays(path):
    with np.load(path, allow_pickle=False) as saved:
        return {name: saved[name] for name in saved.files}


@pytest.mark.distributed
def test_keras_fit_learns_keeps_ranks_equal_and_resumes_bitwise(tmp_path):
    killed = horovodrun(["python", WORKER, tmp_path, *ARGS], timeout=400, check=False)
    assert killed.returncode != 0, killed.stdout[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]  # the same variables (SHA-256) and the same averaged metrics on both ranks
    history = ranks[0]["history"]
    assert ranks[0]["iterations"] == 3 * STEPS
    assert history["loss"][-1] < 0.7 * history["loss"][0], history["loss"]
    assert history["val_accuracy"][-1] > 0.6, history["val_accuracy"]  # 10 classes: chance is 0.1
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == ["epoch-0001"]
    check_powersgd_exchange(tmp_path)

    resumed = horovodrun(["python", EXAMPLE, *ARGS, "--checkpoints", tmp_path / "killed", "--resume"], timeout=300)
    assert "Epoch 2/3" in resumed.stdout and "Epoch 1/3" not in resumed.stdout, resumed.stdout[-3000:]
    for name in ("model_variables.npz", "optimizer.npz"):
        want = arrays(tmp_path / "reference" / "epoch-0003" / name)
        got = arrays(tmp_path / "killed" / "epoch-0003" / name)
        assert sorted(got) == sorted(want)
        for key in want:
            if key != "paths":
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} {key}")
    manifest = json.loads((tmp_path / "killed" / "epoch-0003" / "manifest.json").read_text())
    assert manifest["step"] == 3 * STEPS and manifest["world_size"] == 2


def check_powersgd_exchange(out):
    """The worker's powersgd_exchange (in the first job): model.fit through
    ``DistributedOptimizer(comm__compression="powersgd")`` learns, ends with the same weights on both
    ranks (different data and initial weights per rank), ran hvdtrain's PowerSGD (its counter: 6
    updates), and gives the weights of a hand-written GradientTape loop calling that exchange (up to
    float rounding of Keras's loss; plain allreduce's are about 0.05 away)."""
    ranks = [json.loads((out / f"powersgd-rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    for rank in ranks:
        assert rank["exchange"] == "PowerSGD" and rank["steps"] == 6, rank
        assert rank["losses"][-1] < 0.7 * rank["losses"][0], rank["losses"]
        assert rank["by_hand"] < 1e-5, rank
