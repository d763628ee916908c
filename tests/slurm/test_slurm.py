"""hvdtrain on a real Slurm cluster: controller ``ctl`` and nodes ``n1``, ``n2`` as containers
(tests/slurm/slurmcluster.py), jobs submitted with ``sbatch`` from examples/slurm and watched
with ``squeue``/``scontrol`` as a user would.

* ``srun`` with Gloo self-rendezvous (examples/slurm/srun-gloo.sbatch), both frameworks: one
  Horovod job of 2 ranks on n1 and n2, every rank's parameters identical (the CLI run through
  tests/cluster/workers/cli_ranks.py, by the template's HVDTRAIN_COMMAND);
* ``horovodrun -H $(hvdtrain slurm-hosts)`` inside the allocation (examples/slurm/horovodrun.sbatch,
  over the nodes' sshd; TensorFlow), ``mpirun`` inside the allocation (mpirun.sbatch: Open MPI
  starts its daemons with srun; torch) and ``srun --mpi=pmix`` (srun-pmix.sbatch; TensorFlow), the
  last two on MPI with the PyPI Open MPI: the same metrics and weights, bitwise, as the srun Gloo
  job of their framework (every launch is run by one framework, each framework by Gloo and MPI);
* preemption (examples/slurm/requeue.sbatch): a real ``scontrol requeue`` mid-run (TensorFlow;
  SIGTERM to the tasks, Slurm queues the job again) and a time limit whose ``--signal=USR1@90``
  warning comes mid-run (torch; the script requeues on exit 75; the limit is lowered with
  ``scontrol update TimeLimit=`` once the first run trains, so that neither a slow start on a busy
  machine nor an early warning decides the outcome): each job runs again, continues
  from its step checkpoint by ``--resume auto`` and ends bitwise equal to the uninterrupted srun
  job (every weight and running statistic: the TensorFlow jobs train ResNet-18, with BatchNorm,
  whose per-rank statistics the stop's checkpoint keeps; the torch jobs the small CNN, with
  dropout, whose per-rank random streams it keeps);
* the singleton trap: ``hvdtrain`` started by the batch script of a 2-task job without srun stops
  at once with one line naming the fix.

All jobs are submitted at the start and run side by side (4 CPUs per node are configured on 2
real cores: the slow steps that keep a job running until it is interrupted sleep), except the two
MPI jobs, the second of which waits for the first (``--dependency=afterany``). A requeued job
that Slurm holds back (Reason=BeginTime) is released with ``scontrol update StartTime=now``. The
module waits on events (a checkpoint folder, a line of a job's output, a job's state), polled
every second, never for a fixed time.
Needs Docker (started, or installed with apt-get as root): under CI=true a missing capability
fails; elsewhere the module skips with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cluster.dockerhosts import docker_capability
from jobs import assert_own_statistics_kept, assert_same_run, checkpoint_weights
from slurm.slurmcluster import CONTROLLER, SlurmCluster

WHY_NOT = docker_capability()
if WHY_NOT and os.environ.get("CI") == "true":
    raise RuntimeError(f"tests/slurm must run in CI but cannot: {WHY_NOT}")
pytestmark = [pytest.mark.distributed, pytest.mark.resume, pytest.mark.timeout(2400),
              pytest.mark.skipif(bool(WHY_NOT), reason=f"no Docker: {WHY_NOT}")]

DATA = "/data/mnist-imagefolder"  # this machine's embedded MNIST, mounted read-only on every container
# 512 samples / 2 ranks / batch 32 = 8 optimizer steps per epoch, 2 epochs. Decoding in the rank
# (image.workers=0): Slurm signals every process of a step, and a decoding worker that does not
# ignore SIGUSR1/SIGTERM dies of it (hvdtrain/data/workers.py).
TRAIN = ["--epochs", "2", "--data", DATA, "--batch-size", "32", "--set", "data.max_train_samples=512",
         "--set", "data.max_val_samples=64", "--set", "train.log_every=0", "--set", "train.deterministic=true",
         "--set", "checkpoint.every_steps=5", "--set", "image.workers=0"]
MPI_LAUNCHERS = {"mpirun": "torch", "srun-pmix": "tensorflow"}  # examples/slurm/<name>.sbatch: Horovod on MPI
# (PyPI Open MPI), and the framework that runs it
MODEL = {"torch": [], "tensorflow": ["--set", "model.name=resnet18", "--set", "image.size=8"]}  # BatchNorm in one
REQUEUE, LIMIT = "requeue-tensorflow", "limit-torch"  # the two interrupted jobs, one per framework
CLI_RANKS = "python /opt/hvdtrain/tests/cluster/workers/cli_ranks.py"
# the first run of a job steps slowly, so that it is still training when it is interrupted; the
# requeued run goes at full speed
SLOW_FIRST_RUN = """#!/bin/bash
if [[ "${SLURM_RESTART_COUNT:-0}" == 0 ]]; then export HVDTRAIN_FAULT="slow:step=2:ms=$SLOW_MS"; fi
exec hvdtrain "$@"
"""


def recipe(framework: str, name: str) -> list[str]:
    return ["recipe", "image-classification", "--framework", framework, "--output", f"/shared/runs/{name}", *TRAIN,
            *MODEL[framework]]


# The time-limit job: submitted with a limit it never reaches; once its first run trains, the limit
# is lowered to LIMIT_LEFT_SEC..+60 s from then (Slurm counts whole minutes), so that Slurm's own
# warning (sent when at most WARN_SEC + up to 60 s are left) comes within about a minute, mid-run,
# and leaves the run at least a minute to stop; the requeued run gets the long limit back.
WARN_SEC, LIMIT_LEFT_SEC, LONG_LIMIT_MIN = 90, 90, 30
TRAINING = "image-classification/torch on 2 worker(s)"  # rank 0's first line: the world is formed


def hms_seconds(value: str) -> int:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) as seconds."""
    days, _, clock = value.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


class Jobs:
    """The module's jobs by name, and a thread that plays the cluster's side: ``scontrol requeue``
    of the requeue job once its step-5 checkpoint exists, the time-limit job's limit lowered once
    its first run trains (and raised again for the requeued run), and the release of requeued jobs."""

    def __init__(self, cluster: SlurmCluster):
        self.cluster = cluster
        self.ids: dict[str, int] = {}
        self.events: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def submit(self, name: str, script: str, args: list[str], *sbatch: str, **env: str) -> None:
        self.ids[name] = self.cluster.sbatch("--job-name", name, *sbatch, args=args, env=env,
                                             script=f"/opt/hvdtrain/examples/slurm/{script}")

    def _watch(self) -> None:
        started = time.monotonic()
        step5 = self.cluster.shared() / "runs" / REQUEUE / "checkpoints" / "step-00000005"
        while not self.stop.wait(1):
            try:
                self._poll(started, step5)
            except subprocess.TimeoutExpired as exc:  # a controller slow to answer: ask again next time
                self.events[f"unanswered {exc.cmd[-3:]}"] = time.monotonic() - started

    def _poll(self, started: float, step5: Path) -> None:
        """One round of the cluster's side (see the class)."""
        if "requeued" not in self.events and step5.is_dir():
            self.events["requeued"] = time.monotonic() - started  # once, even unanswered: a second is a second restart
            self.cluster.exec(CONTROLLER, "scontrol", "requeue", str(self.ids[REQUEUE]), timeout=60)
        self._time_limit(started)
        self.cluster.watch_jobs()  # a job that ends long before its test runs is still known then
        asked = self.cluster.ask("squeue", "-h", "-t", "PENDING", "-o", "%i %r")
        pending = asked.stdout if asked is not None else ""
        for line in pending.splitlines():
            job, _, reason = line.partition(" ")
            if reason == "BeginTime" and int(job) in self.ids.values():
                self.cluster.exec(CONTROLLER, "scontrol", "update", f"JobId={job}", "StartTime=now", check=False,
                                  timeout=60)
                self.events[f"released {job}"] = time.monotonic() - started

    def _time_limit(self, started: float) -> None:
        """The time-limit job's first run, once it trains: its limit lowered to LIMIT_LEFT_SEC (whole
        minutes up) from now; once it was requeued (its next run): the long limit back."""
        if "limit raised" in self.events or ("limit lowered" not in self.events
                                             and TRAINING not in self.output(LIMIT)):
            return
        job = self.ids[LIMIT]
        info = self.cluster.job(job)
        if "limit lowered" not in self.events and info.get("JobState") == "RUNNING" and info.get("Restarts") == "0":
            minutes = -(-(hms_seconds(info["RunTime"]) + LIMIT_LEFT_SEC) // 60)
            self.cluster.exec(CONTROLLER, "scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}")
            self.events["limit lowered"] = time.monotonic() - started
        elif "limit lowered" in self.events and int(info.get("Restarts") or 0) >= 1:
            self.cluster.exec(CONTROLLER, "scontrol", "update", f"JobId={job}", f"TimeLimit={LONG_LIMIT_MIN}")
            self.events["limit raised"] = time.monotonic() - started

    def wait(self, name: str, timeout: float = 900) -> dict[str, str]:
        """The job's final ``scontrol show job`` record (COMPLETED or not: the test says what it expects)."""
        return self.cluster.wait_job(self.ids[name], timeout=timeout)

    def output(self, name: str) -> str:
        return self.cluster.job_output(self.ids[name])


@pytest.fixture(scope="module")
def cluster():
    from hvdtrain.data.mnist import embedded_mnist

    # not under pytest's basetemp: a pytest run beside this one prunes old basetemp folders, and
    # this one holds the MUNGE key the containers mount (the images and their build context are
    # tests/cluster/images.py's, shared with tests/cluster)
    tmp = Path(tempfile.mkdtemp(prefix="hvdtrain-slurm-"))
    slurm = SlurmCluster(tmp)
    try:
        slurm.build()
        slurm.start(mounts={DATA: embedded_mnist()})  # written once per machine, not per run
        yield slurm
    finally:
        if os.environ.get("HVDTRAIN_SLURM_KEEP") != "1":  # 1: leave the cluster up to look at it
            slurm.remove()
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def jobs(cluster):
    """Every job of the module, submitted at once (Slurm runs them side by side)."""
    shared = cluster.shared()
    (shared / "slow-first-run.sh").write_text(SLOW_FIRST_RUN)
    (shared / "slow-first-run.sh").chmod(0o755)
    queue = Jobs(cluster)
    for framework in ("torch", "tensorflow"):
        queue.submit(f"gloo-{framework}", "srun-gloo.sbatch", recipe(framework, f"gloo-{framework}"),
                     HVDTRAIN_COMMAND=f"{CLI_RANKS} /shared/runs/gloo-{framework}.ranks.json {framework} --")
    queue.submit(REQUEUE, "requeue.sbatch", recipe("tensorflow", REQUEUE),
                 HVDTRAIN_COMMAND="/shared/slow-first-run.sh", SLOW_MS="2000")
    # the first run (8 s a step: 2 minutes of training) gets the warning within about a minute of
    # the limit being lowered (Jobs._watch), whatever its start-up took on a busy machine
    queue.submit(LIMIT, "requeue.sbatch", recipe("torch", LIMIT), f"--time={LONG_LIMIT_MIN}",
                 f"--signal=USR1@{WARN_SEC}", HVDTRAIN_COMMAND="/shared/slow-first-run.sh", SLOW_MS="8000")
    queue.submit("horovodrun-tensorflow", "horovodrun.sbatch", recipe("tensorflow", "horovodrun-tensorflow"),
                 HVDTRAIN_COMMAND=f"{CLI_RANKS} /shared/runs/horovodrun-tensorflow.ranks.json tensorflow --",
                 HVDTRAIN_SSH_PORT="2222")
    # the MPI jobs one after the other: on the same two nodes, Open MPI's TCP transport of one job
    # took a connection meant for the other's ranks ("server accept cannot find guid", PMIx
    # NOT-FOUND) and the srun --mpi=pmix job hung in its first collective (seen once, 2026-11-25)
    previous = []
    for launcher, framework in MPI_LAUNCHERS.items():
        name = f"{launcher}-{framework}"
        queue.submit(name, f"{launcher}.sbatch", recipe(framework, name), *previous,
                     HVDTRAIN_COMMAND=f"{CLI_RANKS} /shared/runs/{name}.ranks.json {framework} --")
        previous = [f"--dependency=afterany:{queue.ids[name]}"]
    # the singleton trap (test_a_process_started_by_the_batch_script_alone_is_refused): with the others
    queue.ids["alone"] = cluster.sbatch("--job-name", "alone", "--nodes=2", "--ntasks=2", "--wrap",
                                        f"hvdtrain recipe image-classification --output /shared/runs/alone --data {DATA}")
    queue.thread.start()
    yield queue
    queue.stop.set()
    queue.thread.join(timeout=30)


def metrics(cluster: SlurmCluster, name: str) -> list[dict]:
    path = cluster.shared() / "runs" / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ranks(cluster: SlurmCluster, name: str) -> list[dict]:
    return json.loads((cluster.shared() / "runs" / f"{name}.ranks.json").read_text())["ranks"]


def final_weights(cluster: SlurmCluster, name: str, framework: str) -> dict:
    return checkpoint_weights(cluster.shared() / "runs" / name / "checkpoints" / "epoch-0002", framework)


def assert_completed(jobs: Jobs, name: str, restarts: int | None = 0) -> tuple[str, dict[str, str]]:
    """The job ended COMPLETED with exit 0 (after ``restarts`` requeues; None: any), trained to the
    end once (an interrupted run prints where it stopped instead); its output and record."""
    info = jobs.wait(name)
    out = jobs.output(name)
    completed = info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0"
    if not completed:  # the whole output, in the report's captured stdout (pytest shortens the assertion's text)
        print(f"--- job {name}: {info}\n{out}")
    assert completed, (info, out[-6000:])
    if restarts is not None:
        assert int(info["Restarts"]) == restarts, (info, out[-6000:])
    assert out.count("hvdtrain: done") == 1, out[-6000:]
    return out, info


def assert_same_as_srun(cluster: SlurmCluster, name: str, framework: str) -> None:
    rows, reference = metrics(cluster, name), metrics(cluster, f"gloo-{framework}")
    assert [r["epoch"] for r in rows] == [1, 2] == [r["epoch"] for r in reference], (rows, reference)
    assert_same_run(final_weights(cluster, f"gloo-{framework}", framework), final_weights(cluster, name, framework),
                    cluster.shared() / "runs" / f"gloo-{framework}", cluster.shared() / "runs" / name)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_srun_forms_one_gloo_job_from_slurms_variables(cluster, jobs, framework):
    out, _ = assert_completed(jobs, f"gloo-{framework}")
    assert "hvdtrain: workers on n1 (ranks 0), n2 (ranks 1)" in out, out[-4000:]
    assert f"image-classification/{framework} on 2 worker(s)" in out, out[-4000:]
    report = ranks(cluster, f"gloo-{framework}")
    assert [(r["rank"], r["host"]) for r in report] == [(0, "n1"), (1, "n2")], report
    assert len({r["params_sha256"] for r in report}) == 1, report  # bitwise identical on both ranks
    rows = metrics(cluster, f"gloo-{framework}")
    assert [r["epoch"] for r in rows] == [1, 2] and rows[-1]["world_size"] == 2, rows


def test_horovodrun_inside_the_allocation_matches_srun(cluster, jobs):
    out, _ = assert_completed(jobs, "horovodrun-tensorflow")
    assert "hvdtrain: horovodrun -np 2 -H n1:1,n2:1:" in out, out[-4000:]  # hvdtrain slurm-hosts
    assert "hvdtrain: workers on n1 (ranks 0), n2 (ranks 1)" in out, out[-4000:]
    assert ranks(cluster, "horovodrun-tensorflow") == ranks(cluster, "gloo-tensorflow")
    assert_same_as_srun(cluster, "horovodrun-tensorflow", "tensorflow")


@pytest.mark.parametrize("launcher", MPI_LAUNCHERS)
def test_mpi_inside_the_allocation_matches_srun(cluster, jobs, launcher):
    """mpirun (its daemons started by srun; torch) and srun --mpi=pmix (TensorFlow) with the PyPI
    Open MPI: Horovod on MPI, the same result, bitwise, as the Gloo job of that framework."""
    framework = MPI_LAUNCHERS[launcher]
    name = f"{launcher}-{framework}"
    out, _ = assert_completed(jobs, name)
    assert "Sorry!" not in out and "not-valid" not in out, out[-4000:]  # no PMIx notice per rank
    assert ranks(cluster, name) == ranks(cluster, f"gloo-{framework}")
    assert_same_as_srun(cluster, name, framework)


def test_scontrol_requeue_mid_run_continues_bitwise(cluster, jobs):
    out, _ = assert_completed(jobs, REQUEUE, restarts=1)
    assert "requeued" in jobs.events, (jobs.events, out[-6000:])
    first, second = out.split(" run 2 on ")
    assert "DUE TO JOB REQUEUE" in first and "rank 0: SIGTERM received" in first, first[-4000:]
    assert "SIGTERM received: stopped every rank after optimizer step" in first, first[-4000:]
    assert "Exited with exit code 75" in first, first[-4000:]
    stopped = first.split(f"saved step checkpoint /shared/runs/{REQUEUE}/checkpoints/")[1].split(";")[0]
    assert "step-00000005" < stopped < "step-00000016", stopped  # after the requeue, before the end
    assert f"resuming from /shared/runs/{REQUEUE}/checkpoints/{stopped}" in second
    assert_same_as_srun(cluster, REQUEUE, "tensorflow")  # the BatchNorm statistics included
    # the stop's checkpoint is pruned by then (keep_last); every step checkpoint keeps them alike
    checkpoints = cluster.shared() / "runs" / REQUEUE / "checkpoints"
    assert_own_statistics_kept(max(checkpoints.glob("step-*")))


def test_time_limit_warning_checkpoints_requeues_and_continues_bitwise(cluster, jobs):
    out, _ = assert_completed(jobs, LIMIT, restarts=1)  # the requeued run has the long limit back
    assert "limit lowered" in jobs.events and "limit raised" in jobs.events, (jobs.events, out[-6000:])
    assert "SIGUSR1 received: stopped every rank after optimizer step" in out, out[-6000:]
    assert "stopped at a checkpoint (exit 75): back to the queue" in out, out[-6000:]
    assert f"resuming from /shared/runs/{LIMIT}/checkpoints/" in out, out[-6000:]
    assert "DUE TO TIME LIMIT" not in out, out[-6000:]  # stopped by hvdtrain before Slurm's limit
    assert_same_as_srun(cluster, LIMIT, "torch")


def test_a_process_started_by_the_batch_script_alone_is_refused(cluster, jobs):
    info = jobs.wait("alone")
    out = jobs.output("alone")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", (info, out)
    assert "hvdtrain: error: this process runs in the batch script of Slurm job" in out, out
    assert "(SLURM_NTASKS=2) but no launcher started it" in out and "`srun hvdtrain ...`" in out, out
    assert "Traceback" not in out, out
    assert not (cluster.shared() / "runs" / "alone" / "metrics.jsonl").exists()
