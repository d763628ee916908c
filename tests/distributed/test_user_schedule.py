"""issue 38, item 2, under real `horovodrun -np 2 --gloo`: the task's own optimizer and LR schedule run
as given through the Trainer, across a kill-and-resume (one job per framework, three runs each:
tests/distributed/workers/user_schedule.py).

* torch: AdamW(lr=1e-3) + OneCycleLR: every real update uses exactly the LR of the same schedule
  stepped by hand (an optimizer step pre-hook reads it), the start-up state-creating step fires no
  hook, the logged LR is the used one, and the resumed run continues the schedule and ends with the
  uninterrupted run's weights, bit for bit; with ZeRO-2 (parallel.shard_optimizer=gradients) the same
  schedule reaches the shard optimizer (the same weights as data parallelism, to rounding).
* Keras: AdamW built with a CosineDecay (uninterrupted) and a plain AdamW with the CosineDecay as
  ``TrainTask.scheduler`` (killed and resumed) are the same run: the LR of every update is the
  schedule's at that update, the optimizer counted one iteration per update, same final weights.
* ``config.yaml`` names the optimizer and schedule that ran, ``metrics.jsonl`` the LR used.
* Iterable sources: the validation data is a torch ``IterableDataset`` (torch) and an unbatched
  ``tf.data.Dataset`` (Keras), read into memory on both ranks; every epoch is evaluated on it.
* ``train.max_steps`` (both frameworks): a run limited to update 11 stops inside epoch 2 with a
  step-11 checkpoint and that epoch's row; resumed without the limit it goes on at the next sample,
  with the schedule's LR at every update, and ends with the uninterrupted run's weights, bit for bit.
"""

import json

import numpy as np
import pytest

from jobs import REPO, horovodrun

WORKER = REPO / "tests" / "distributed" / "workers" / "user_schedule.py"
UPDATES, EVERY, STOP = 16, 3, 11
RESUMED_FROM = (STOP // EVERY) * EVERY  # the last step checkpoint before the kill


def report(tmp_path, framework):
    path = tmp_path / "report.json"
    horovodrun(["python", WORKER, framework, path, tmp_path / "runs"], timeout=400)
    return json.loads(path.read_text())


def same_weights(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def check_sources(r, kinds):
    for name in ("reference", "resumed", "limited", "continued"):
        assert r[name]["sources"] == kinds, name
        assert r[name]["val_loss"] and all(np.isfinite(v) for v in r[name]["val_loss"]), r[name]["val_loss"]


def check_max_steps(r, hand, approx=lambda v: v):
    assert r["limited"]["logged"] == approx(hand[:STOP]) and r["limited"]["updates"] == STOP
    assert r["continued"]["logged"] == approx(hand[STOP:]) and r["continued"]["updates"] == UPDATES
    same_weights(r["continued"]["weights"], r["reference"]["weights"])
    assert "step-00000011" in r["limited_checkpoints"] and "epoch-0002" in r["limited_checkpoints"]
    assert r["limited_rows"] == [[1, 8], [2, STOP], [2, UPDATES]]  # the stop's evaluation, then the whole epoch


@pytest.mark.distributed
@pytest.mark.lr_schedule
def test_torch_onecycle_runs_as_stepped_by_hand_across_a_resume(tmp_path):
    r = report(tmp_path, "torch")
    hand = r["by_hand"]
    assert len(set(hand)) == UPDATES  # the LR changes at every update
    assert r["reference"]["used"] == hand  # one hook call per real update: none for the start-up step
    assert r["reference"]["logged"] == hand
    assert r["stopped"]["used"] == hand[:STOP]
    assert r["resumed"]["used"] == hand[RESUMED_FROM:] == r["resumed"]["logged"]
    assert r["resumed"]["updates"] == r["reference"]["updates"] == UPDATES  # AdamW's own step count
    same_weights(r["resumed"]["weights"], r["reference"]["weights"])
    assert r["metrics_lr"]["run"] == r["metrics_lr"]["reference"] == [hand[7], hand[15]]
    # ZeRO-2: the shard optimizer takes the scheduler's LR (a constant LR would end far from these weights)
    assert r["zero2"]["logged"] == hand
    for zero2, plain in zip(r["zero2"]["weights"], r["reference"]["weights"]):
        np.testing.assert_allclose(np.asarray(zero2), np.asarray(plain), rtol=1e-5, atol=1e-7)
    optim = r["optim"]
    assert optim["ran"] == "torch.optim.adamw.AdamW + torch.optim.lr_scheduler.OneCycleLR"
    assert optim["schedule"] == "task" and "name" not in optim
    check_max_steps(r, hand)
    check_sources(r, ["MapSource", "StreamSource"])  # the validation rows: a torch IterableDataset
    assert r["limited"]["used"] == hand[:STOP] and r["continued"]["used"] == hand[STOP:]


@pytest.mark.distributed
@pytest.mark.lr_schedule
def test_keras_cosine_decay_runs_as_stepped_by_hand_across_a_resume(tmp_path):
    r = report(tmp_path, "tensorflow")
    hand = r["by_hand"]
    assert len(set(hand)) == UPDATES
    assert r["reference"]["logged"] == pytest.approx(hand, rel=1e-6)
    assert r["stopped"]["logged"] == pytest.approx(hand[:STOP], rel=1e-6)
    assert r["resumed"]["logged"] == pytest.approx(hand[RESUMED_FROM:], rel=1e-6)
    assert r["resumed"]["updates"] == r["reference"]["updates"] == UPDATES  # Keras's iterations: the schedule's step
    same_weights(r["resumed"]["weights"], r["reference"]["weights"])
    assert r["metrics_lr"]["run"] == r["metrics_lr"]["reference"]
    optim = r["optim"]
    assert optim["ran"].startswith("keras.src.optimizers.adamw.AdamW + ") and optim["ran"].endswith("CosineDecay")
    assert optim["schedule"] == "task" and "name" not in optim
    check_max_steps(r, hand, approx=lambda v: pytest.approx(v, rel=1e-6))
    check_sources(r, ["ColumnSource", "StreamSource"])  # the validation rows: an unbatched tf.data pipeline
