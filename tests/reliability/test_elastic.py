"""Elastic training under `horovodrun --min-np 1 --max-np 2 --host-discovery-script`: a worker is
killed (SIGKILL), the survivor rolls back to the last commit and carries on alone, the host comes
back after Horovod's blacklist cool-down, rejoins and receives the state; the run finishes.

The two "hosts" are `localhost` and `127.0.0.1`: two names Horovod treats as separate hosts, both
on this machine (no ssh needed). TensorFlow runs this with hvdtrain's own batch per worker (the LR
follows the world size); PyTorch runs it with a fixed global batch on two 2-slot hosts (4 -> 2 -> 4
workers, issue 42), once in bitwise mode and once without, and the kill, rollback, re-form and
rejoin are asserted there."""

import json
import math

import numpy as np
import pytest

from jobs import BIN, REPO, horovodrun, hvdtrain_cli, run

# 2,048 samples / 2 ranks / batch 16 = 64 steps per epoch; commit every 2 steps; kill rank 1 before
# step 10. The survivor is slowed by 100 ms a step while it works alone (HVDTRAIN_FAULT slow with
# size=1), so it would need at least 23 s for what is left, well beyond the host's 5-10 s cool-down
# and return: without it a fast machine finished the run before the host came back. Once the host
# has rejoined, the two train at full speed.
ARGS = ["--batch-size", "16", "--set", "data.max_train_samples=2048", "--set", "data.max_val_samples=64",
        "--set", "train.log_every=0", "--epochs", "2", "--elastic", "--set", "train.elastic_commit_every=2",
        "--set", "train.stall_timeout_sec=60"]


SAMPLES, BATCH, EPOCHS, BASE_LR, WARMUP_EPOCHS = 2048, 16, 2, 0.05, 0.2  # the image recipe's SGD defaults

# Horovod's Gloo timeout (HOROVOD_GLOO_TIMEOUT_SECONDS, 30 s by default) bounds two waits here:
# a host that rejoins starts new processes (torch or TensorFlow imported, Horovod initialised) while the
# survivors wait for them in Gloo's rendezvous; on a loaded 2-core machine in its slow state the starts
# took longer than 30 s (2026-11-28: "timeout after 30 seconds for key(s): 2", then the job hung until
# the test's timeout). And when a host dies, a survivor whose collective waits on another survivor
# (whose background loop has already failed, its connections still open) sees the loss only when that
# timeout ends (measured: one survivor at once, "Connection closed by peer", the other 30 s later,
# "Timed out waiting 30000ms for recv"). 60 s leaves the starts twice the default at the cost of 30 s
# more per loss.
REJOIN_ENV = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "60"}


def per_epoch(world_size):
    return SAMPLES // (BATCH * world_size)


def expected_lr(step, world_size):
    """Cosine with warmup, written out, at (fractional) update ``step`` of ``world_size`` workers."""
    warmup, total = round(WARMUP_EPOCHS * per_epoch(world_size)), EPOCHS * per_epoch(world_size)
    progress = min(1.0, (step - warmup) / (total - warmup - 1))
    return BASE_LR * world_size * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["tensorflow"])  # torch: the fixed-global-batch launches below
def test_worker_killed_then_host_rejoins(tmp_path, framework):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    out = tmp_path / "run"
    proc = run([BIN / "horovodrun", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", discover,
                "--network-interfaces", "lo", "--blacklist-cooldown-range", "5", "10",
                hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *ARGS],
               env={"HVDTRAIN_FAULT": "kill:rank=1:step=10,slow:rank=0:step=10:ms=100:size=1", **REJOIN_ENV},
               timeout=420)
    # the last commit before the kill was at step 10: 10 steps x 16 samples x 2 workers
    assert "re-formed with 1 worker(s); continuing at epoch 1, after 320 samples" in proc.stdout
    assert "re-formed with 2 worker(s)" in proc.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert rows[-1]["world_size"] == 2
    assert "hvdtrain: done" in proc.stdout
    # issue 10, item 2: after each re-form the LR is the schedule's value for the samples seen at the
    # new world size (the last update of an epoch starts 1 or, after a resharded remainder, 1.5
    # updates before its end), not the value at a step count kept in the old world size's units.
    for row in rows:
        lo, hi = sorted(expected_lr(row["epoch"] * per_epoch(row["world_size"]) - back, row["world_size"])
                        for back in (1.0, 1.5))
        assert lo - 1e-12 <= row["lr"] <= hi + 1e-12, row


@pytest.mark.distributed
def test_rank_0_lost_before_the_first_sync_keeps_resume(tmp_path):
    """Issue 22, item 6: where an elastic job starts is decided in the elastic state's sync by
    whoever is rank 0 then. Rank 0 is killed as it enters the first sync (HVDTRAIN_FAULT
    kill-at-sync): the survivor, now rank 0, plans the --resume itself and continues from the
    checkpoint. Before, only the initial rank 0 planned and loaded the checkpoint: in TensorFlow the
    survivor crashed on the failed broadcast inside the sync (TensorFlow's UnknownError, not
    Horovod's recoverable error), in torch it trained from scratch into the old run."""
    out = tmp_path / "run"
    small = ["--batch-size", "16", "--set", "data.max_train_samples=128", "--set", "data.max_val_samples=32",
             "--set", "train.log_every=0", "--set", "train.tensorboard=false", "--set", "train.progress_bar=false"]
    run([hvdtrain_cli(), "recipe", "image-classification", "--framework", "tensorflow", "--output", out,
         "--epochs", "1", *small], timeout=300)  # one process: checkpoint epoch-0001 at step 8
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    discover.chmod(0o755)
    proc = run([BIN / "horovodrun", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", discover,
                "--network-interfaces", "lo", hvdtrain_cli(), "recipe", "image-classification",
                "--framework", "tensorflow", "--output", out, "--epochs", "2", "--elastic", "--resume", *small],
               env={"HVDTRAIN_FAULT": "kill-at-sync:rank=0"}, timeout=300)
    assert "re-formed with 1 worker(s)" in proc.stdout
    assert f"resuming from {out / 'checkpoints' / 'epoch-0001'}" in proc.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch-0001", "epoch-0002"]
    manifest = json.loads((out / "checkpoints" / "epoch-0002" / "manifest.json").read_text())
    assert manifest["step"] == 16  # 8 updates of epoch 1 (the checkpoint) + 8 of epoch 2 on one worker


WORLD_SIZE_WORKER = REPO / "tests" / "distributed" / "workers" / "world_size.py"
# issue 42's small ResNet (BatchNorm): 96 samples, a fixed global batch of 16 in micro-batches of 4 (4 per update),
# 2 epochs (12 updates); no dropout: without bitwise mode dropout is drawn per rank, which a re-form changes
GLOBAL = ["train.global_batch_size=16", "train.batch_size=4", "train.epochs=2"]
# the largest difference of a parameter between the 4 -> 2 -> 4 run without bitwise mode and the uninterrupted
# run seen on this machine: see PLAIN_LARGEST in the report; the tolerance leaves room for other CPUs
PLAIN_TOLERANCE = 1e-5


def elastic_world_size_run(tmp_path, name, extra):
    """4 workers on two 2-slot hosts; the host of ranks 2 and 3 dies before update 4 (both killed):
    ranks 0 and 1 roll back to the commit after update 3 and go on as 2 workers, slowed (3 s a
    micro-batch, sleeping) while they are 2 so the host is back before the end: 4 workers again."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n127.0.0.1:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    report = tmp_path / f"{name}.json"
    proc = run([BIN / "horovodrun", "-np", "4", "--min-np", "2", "--max-np", "4", "--host-discovery-script", discover,
                "--network-interfaces", "lo", "--blacklist-cooldown-range", "1", "2",
                "python", WORLD_SIZE_WORKER, report, tmp_path / name, *GLOBAL, "train.elastic=true",
                "train.elastic_commit_every=1", *extra],
               env={"HVDTRAIN_FAULT": "kill:rank=2:step=3:size=4,kill:rank=3:step=3:size=4,"
                                      "slow:rank=0:step=3:ms=3000:size=2", **REJOIN_ENV}, timeout=420)
    assert "re-formed with 2 worker(s); continuing at epoch 1, after 48 samples" in proc.stdout  # after update 3
    assert "on 2 worker(s): each accumulates 2 micro-batch(es) of 4 per update" in proc.stdout
    assert "re-formed with 4 worker(s)" in proc.stdout and "on 4 worker(s): each accumulates 1" in proc.stdout
    return json.loads(report.read_text())


@pytest.mark.distributed
def test_a_fixed_global_batch_goes_4_then_2_then_4_workers_and_ends_as_the_uninterrupted_run(tmp_path):
    """Issue 42, item 2: with train.global_batch_size an elastic job that loses a host (4 -> 2
    workers) and gets it back (-> 4) re-deals the same updates at each re-form (each worker's
    accumulation 1, then 2, then 1). In bitwise mode the model after every one of the 12 updates is
    the uninterrupted run's, bit for bit, and so are each epoch's step and LR; the metrics rows name
    the world size of each range of updates. Without bitwise mode the run ends with parameters
    within float tolerance of it. The uninterrupted run is one worker, without a launcher: in
    bitwise mode 1, 2 and 4 uninterrupted workers give the same bits
    (tests/distributed/test_world_size.py), so it stands for the 4-worker run at a quarter of the CPU."""
    bitwise = ["train.reproducible=world-size"]
    run(["python", WORLD_SIZE_WORKER, tmp_path / "reference.json", tmp_path / "reference", *GLOBAL, *bitwise],
        timeout=300)
    reference = json.loads((tmp_path / "reference.json").read_text())
    assert len(reference["hashes"]) == 12 and len(set(reference["hashes"])) == 12  # every update moved the model
    elastic = elastic_world_size_run(tmp_path, "bitwise", bitwise)
    assert elastic["hashes"] == reference["hashes"]
    rows = elastic["metrics"]
    assert [(r["step"], r["lr"]) for r in rows] == [(r["step"], r["lr"]) for r in reference["metrics"]]
    ranges = [span for r in rows for span in r.get("world_sizes", [[r["step"] - 5, r["step"], r["world_size"]]])]
    assert ranges[0] == [1, 3, 4] and ranges[1][0] == 4 and ranges[1][2] == 2, rows  # updates 1-3 on 4, then 2
    assert ranges[-1][1:] == [12, 4] and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:])), rows
    plain = elastic_world_size_run(tmp_path, "plain", [])
    largest = max(float(np.max(np.abs(np.array(a) - np.array(b)))) for a, b in zip(plain["params"], reference["params"]))
    print(f"largest parameter difference without bitwise mode: {largest:.3g}")
    assert largest <= PLAIN_TOLERANCE, largest
    assert plain["hashes"] != reference["hashes"]  # without bitwise mode the bits differ: the hashes can fail
