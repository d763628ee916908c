"""``parallel.shard_optimizer=optimizer`` (ZeRO-1, PyTorch) under real ``horovodrun --gloo``.

* Through the adapter, on 2 and 4 ranks: SGD with momentum, Adam and AdamW (also with gradient
  accumulation and float16 on the wire) take the same updates as data parallelism (1e-6;
  global-norm clipping on), each rank keeps 1/N of the optimizer state, and
  the checkpoint holds the whole state in data parallelism's format: each kind of run resumes the
  other's.
* Through the CLI: a sharded run killed mid-epoch and resumed ends bitwise equal to one that was
  not, and its checkpoint resumes on 4 ranks (re-sharded on load).
"""

import json
import math

import numpy as np
import pytest

from jobs import REPO, assert_same_run, checkpoint_weights, horovodrun, hvdtrain_cli, run_metrics as metrics

WORKER = REPO / "tests" / "distributed" / "workers" / "sharded_updates.py"
OPTIMIZERS = ("sgd", "adam", "adamw", "adamw_accumulation_fp16")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for size in (2, 4):
        path = tmp_path_factory.mktemp(f"np{size}") / "report.json"
        horovodrun(["python", WORKER, path], np=size, timeout=300)
        out[size] = json.loads(path.read_text())
        assert out[size]["world_size"] == size
    return out


def _close(actual, expected, what):
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=0, atol=1e-6, err_msg=what)


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_updates_equal_data_parallelism(reports, size, name):
    runs = reports[size]["runs"][name]
    for step, (sharded, plain) in enumerate(zip(runs["optimizer"]["weights"], runs["none"]["weights"])):
        _close(sharded, plain, f"{name}, {size} ranks, after update {step + 1}")
    assert runs["none"]["weights"][0] != runs["none"]["weights"][-1]  # the updates did move the weights


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_rank_keeps_its_share_of_the_optimizer_state(reports, size, name):
    runs = reports[size]["runs"][name]
    whole, shares = runs["none"]["state_bytes"], runs["optimizer"]["state_bytes"]
    assert len(set(whole)) == 1 and len(shares) == size
    # groups: weights 7*5 + 5*3 = 50 elements, biases 5 + 3 = 8; each padded to a multiple of N
    per_rank = (math.ceil(50 / size) + math.ceil(8 / size)) * 4 * (whole[0] // (58 * 4))
    assert shares == [per_rank] * size, (shares, whole)
    assert per_rank <= whole[0] / size * 1.15


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_checkpoint_holds_the_whole_state_in_data_parallel_format(reports, name):
    runs = reports[2]["runs"][name]
    plain, sharded = runs["none"]["saved"], runs["optimizer"]["saved"]
    assert plain.keys() == sharded.keys() and len(plain) == 4  # every parameter of the model
    for index in plain:
        assert plain[index].keys() == sharded[index].keys()
        for key in plain[index]:
            _close([sharded[index][key]], [plain[index][key]], f"{name} state {index}/{key}")


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_kind_of_run_resumes_the_others_checkpoint(reports, size, name):
    runs = reports[size]["runs"][name]
    _close(runs["none"]["resumed_by_other"], runs["optimizer"]["resumed_by_other"], f"{name}, {size} ranks")
    assert runs["none"]["resumed_by_other"] != runs["none"]["weights"][-1]


# 512 samples / 2 ranks / batch 32 = 8 optimizer steps per epoch; checkpoints every 3 steps
RUN = ["--batch-size", "32", "--set", "data.max_train_samples=512", "--set", "data.max_val_samples=128",
       "--set", "train.log_every=0", "--set", "checkpoint.every_steps=3", "--set", "train.deterministic=true",
       "--set", "train.tensorboard=false", "--set", "parallel.shard_optimizer=optimizer",
       "--set", "optim.name=adamw", "--set", "optim.lr=0.002"]


def command(out, epochs, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--output", out,
            "--epochs", str(epochs), *RUN, *extra]


def test_kill_and_resume_is_bitwise_equal_and_the_checkpoint_resumes_on_4_ranks(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    horovodrun(command(straight, 2))
    crash = horovodrun(command(killed, 2), check=False, env={"HVDTRAIN_FAULT": "kill:rank=1:step=14"})
    assert crash.returncode != 0
    names = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert "step-00000012" in names and "epoch-0002" not in names, names
    horovodrun(command(killed, 2, "--resume"))
    assert_same_run(checkpoint_weights(straight / "checkpoints" / "epoch-0002", "torch"),
                    checkpoint_weights(killed / "checkpoints" / "epoch-0002", "torch"), straight, killed)

    wider = horovodrun(command(killed, 3, "--resume"), np=4)  # the whole state, re-sharded over 4 ranks
    assert "epoch 3" in wider.stdout
    rows = metrics(killed)
    assert [r["epoch"] for r in rows] == [1, 2, 3] and rows[-1]["world_size"] == 4
    assert np.isfinite(rows[-1]["train_loss"]) and rows[-1]["train_loss"] < rows[0]["train_loss"]
