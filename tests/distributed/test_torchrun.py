"""Issue 61, items 2 and 9: ``torchrun --standalone --nproc_per_node=2`` starts ONE Horovod job of
2 workers (hvdtrain/launch/torchrun.py), not two one-worker jobs over all the data; the DDP
tutorial's script ported to prepare() (examples/from_ddp.py, docs/guides/from-ddp.md) runs as
written under it and resumes from its snapshot. The variables torchrun sets, and a set of them at
odds, in-process: tests/unit/test_torchrun_env.py."""

import json

import pytest

from jobs import BIN, REPO, run, run_metrics

EXAMPLE = REPO / "examples" / "from_ddp.py"


def torchrun(*args):
    return run([BIN / "torchrun", "--standalone", "--nproc_per_node=2", EXAMPLE, *args], timeout=300)


def steps_lines(out: str) -> list[str]:
    return sorted(line for line in out.splitlines() if "| Steps:" in line)


@pytest.mark.distributed
def test_torchrun_runs_one_two_worker_job_and_the_ddp_port_resumes_from_its_snapshot(tmp_path):
    out = tmp_path / "from-ddp"
    first = torchrun("2", "1", "--samples", "256", "--output", out)  # total_epochs, save_every
    # 256 samples, 32 per worker: 4 steps each on 2 workers (8 each, twice, as two one-worker jobs)
    assert steps_lines(first.stdout) == sorted(f"[rank {r}] Epoch {e} | Batchsize: 32 | Steps: 4"
                                               for r in (0, 1) for e in (0, 1)), first.stdout
    assert [(row["epoch"], row["step"]) for row in run_metrics(out)] == [(1, 4), (2, 8)]  # written once
    manifest = json.loads((out / "checkpoints" / "epoch-0002" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    second = torchrun("3", "1", "--samples", "256", "--output", out)
    assert "Resuming training from snapshot at Epoch 2" in second.stdout
    assert steps_lines(second.stdout) == [f"[rank {r}] Epoch 2 | Batchsize: 32 | Steps: 4" for r in (0, 1)]
    assert [(row["epoch"], row["step"]) for row in run_metrics(out)] == [(1, 4), (2, 8), (3, 12)]
