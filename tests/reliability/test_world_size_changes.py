"""issue 10, items 1 and 2: a run that grows (1 -> 2 -> 4 workers) and shrinks (4 -> 2) through
killed workers and `--resume`, with step checkpoints, under real `horovodrun --gloo`.

Progress is the position in the data, so the LR at each epoch end is the schedule's value for
the samples seen at the world size of that moment (its peak scaled for that global batch), the
run ends at the schedule's floor, the step count only grows, and every checkpoint written is
still there, once, in training order. Each resume on another world size says so, naming the
checkpoint and the position in the epoch."""

import json
import math

import pytest

from jobs import horovodrun, hvdtrain_cli
from hvdtrain.core.checkpoint import CheckpointManager

# 512 samples, batch 16: 32 updates per epoch on 1 worker, 16 on 2, 8 on 4; a step checkpoint every
# 8 updates; base LR 0.05 scaled linearly (SGD), warmup 0.2 epochs, cosine to 0 over 4 epochs.
EPOCHS, SAMPLES, BATCH, BASE_LR, WARMUP_EPOCHS = 4, 512, 16, 0.05, 0.2
ARGS = ["--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--set", f"data.max_train_samples={SAMPLES}",
        "--set", "data.max_val_samples=64", "--set", "train.log_every=0", "--set", "checkpoint.every_steps=8",
        "--set", "checkpoint.keep_last=100", "--set", "train.tensorboard=false"]
# (workers, the step before which a worker is killed, which rank): the legs of the run
LEGS = [(1, 44, 0), (2, 66, 1), (4, 73, 1), (2, None, None)]


def expected_lr(epoch, world_size):
    """The cosine-with-warmup schedule, written out, at the last update of ``epoch`` (1-based)."""
    steps = SAMPLES // (BATCH * world_size)
    warmup, total = round(WARMUP_EPOCHS * steps), EPOCHS * steps
    step = epoch * steps - 1
    progress = min(1.0, (step - warmup) / (total - warmup - 1))
    return BASE_LR * world_size * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.distributed
def test_grow_and_shrink_with_step_checkpoints(tmp_path):
    out = tmp_path / "run"
    command = [hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--output", out, *ARGS]
    for i, (workers, kill_at, rank) in enumerate(LEGS):
        env = {"HVDTRAIN_FAULT": f"kill:rank={rank}:step={kill_at}"} if kill_at else {}
        proc = horovodrun(command + (["--resume"] if i else []), np=workers, check=kill_at is None, env=env,
                          timeout=300)
        if kill_at:
            assert proc.returncode != 0, proc.stdout[-2000:]
        assert "already exists" not in proc.stdout + proc.stderr
        if i == 1:  # the 1-worker leg was killed before step 44: step 40 is 128 samples into epoch 2
            assert "step-00000040 at epoch 2, after 128 samples (saved with 1 workers, now 2: the rest of the " \
                   "epoch is resharded" in proc.stdout, proc.stdout[-3000:]

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert [r["world_size"] for r in rows] == [1, 2, 4, 2]
    assert [r["step"] for r in rows] == [32, 52, 66, 76]  # updates taken, counted on across every resume
    for row in rows:
        assert row["lr"] == pytest.approx(expected_lr(row["epoch"], row["world_size"]), rel=1e-9, abs=1e-12), row
    assert rows[-1]["lr"] == pytest.approx(0.0, abs=1e-12)

    checkpoints = CheckpointManager(out / "checkpoints").checkpoints()
    names = [c.path.name for c in checkpoints]
    assert names == ["step-00000008", "step-00000016", "step-00000024", "epoch-0001", "step-00000040",
                     "step-00000048", "epoch-0002", "step-00000056", "step-00000064", "epoch-0003",
                     "step-00000072", "epoch-0004"]
    assert [c.step for c in checkpoints] == sorted(c.step for c in checkpoints)
    positions = [(c.epoch, c.consumed) for c in checkpoints]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert [c.manifest["world_size"] for c in checkpoints] == [1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 2]
