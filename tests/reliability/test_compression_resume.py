"""Exact resume with gradient compression and local SGD: a 2-rank run whose worker is killed with
SIGKILL (HVDTRAIN_FAULT) mid-epoch and restarted with `--resume` ends bitwise equal to an
uninterrupted run, because the checkpoint keeps every rank's error-feedback buffers, the Q
matrices, the step counters and, between local-SGD averagings, each rank's own replica. A resume
on a different world size starts that state afresh and says so. The state reaches rank 0 only: on 4
ranks, a rank other than 0 holds no more than its own state's bytes while it is gathered."""


import json
import shutil
import sys
from pathlib import Path

import pytest

from jobs import assert_same_run, checkpoint_weights, horovodrun, hvdtrain_cli, run

# 512 samples / 2 ranks / batch 32 = 8 optimizer steps per epoch; checkpoints every 3 steps.
RUN = ["--epochs", "2", "--batch-size", "32", "--set", "data.max_train_samples=512",
       "--set", "data.max_val_samples=128", "--set", "train.log_every=0", "--set", "checkpoint.every_steps=3",
       "--set", "train.deterministic=true", "--set", "train.tensorboard=false"]
KILL_AT = 14  # optimizer step in epoch 2; the last checkpoint before it is step 12 (local SGD H=3: mid-period)
OPTIONS = {
    "powersgd": ["--set", "comm.compression=powersgd", "--set", "comm.powersgd_rank=2",
                 "--set", "comm.powersgd_start_step=2", "--set", "comm.powersgd_min_size=256"],
    "topk": ["--set", "comm.compression=topk", "--set", "comm.topk_ratio=0.05"],
    "local_sgd": ["--set", "comm.local_sgd_steps=3"],
}


def command(framework, out, option, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *RUN,
            *OPTIONS[option], *extra]


def final_weights(out, framework):
    return checkpoint_weights(out / "checkpoints" / "epoch-0002", framework)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted 2-epoch run of a (framework, option), launched once per module: the
    kill-and-resume test compares against it, the world-size test resumes a copy of it."""
    runs = {}

    def get(framework, option):
        if (framework, option) not in runs:
            out = tmp_path_factory.mktemp(f"straight-{framework}-{option}")
            horovodrun(command(framework, out, option))
            runs[framework, option] = out
        return runs[framework, option]
    return get


@pytest.mark.distributed
# One framework per option keeps CI short (each case is three 2-rank runs); both frameworks run every
# option's exchange in tests/distributed/test_compression.py.
@pytest.mark.parametrize("framework, option", [("torch", "powersgd"), ("tensorflow", "topk"),
                                               ("torch", "local_sgd")])
def test_kill_then_resume_is_bitwise_equal(tmp_path, straight, framework, option):
    straight, killed = straight(framework, option), tmp_path / "killed"
    assert (straight / "checkpoints" / "epoch-0002" / "comm_state.npz").is_file()

    crash = horovodrun(command(framework, killed, option), check=False,
                       env={"HVDTRAIN_FAULT": f"kill:rank=1:step={KILL_AT}"})
    assert crash.returncode != 0
    names = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert "step-00000012" in names and "epoch-0002" not in names, names

    resumed = horovodrun(command(framework, killed, option, "--resume"))
    assert "step-00000012" in resumed.stdout and "starts afresh" not in resumed.stdout

    assert_same_run(final_weights(straight, framework), final_weights(killed, framework), straight, killed)


@pytest.mark.distributed
def test_resume_on_another_world_size_resets_the_state_and_says_so(tmp_path, straight):
    out = tmp_path / "run"  # a copy of the 2-rank powersgd run (epoch-0002 with its exchange state)
    shutil.copytree(straight("torch", "powersgd"), out)
    proc = run(command("torch", out, "powersgd", "--set", "train.epochs=3", "--resume"))  # one process, no launcher
    assert "written by 2 workers, this job has 1" in proc.stdout and "starts afresh" in proc.stdout


@pytest.mark.distributed
def test_the_checkpoint_gathers_the_exchange_state_to_rank_0_only(tmp_path):
    """4 ranks with 64 MB of error-feedback buffers each: the checkpoint's gather gives rank 0 every
    rank's state and the others none, and a rank other than 0 needs at most twice its state in extra
    memory (measured: 65 MB; the all-gather before: 704 MB on every rank, 4 states held by each)."""
    job = Path(__file__).with_name("gather_memory_job.py")
    proc = horovodrun([sys.executable, job, "64"], np=4)
    rows = {}
    for line in proc.stdout.splitlines():
        if '"peak_extra_mb"' in line:
            row = json.loads(line[line.index("{"):])
            rows[row["rank"]] = row
    assert sorted(rows) == [0, 1, 2, 3], proc.stdout[-3000:]
    assert rows[0]["states_held"] == 4
    for rank in (1, 2, 3):
        assert rows[rank]["states_held"] == 0, rows[rank]
        assert rows[rank]["peak_extra_mb"] < 2 * 64, rows[rank]
