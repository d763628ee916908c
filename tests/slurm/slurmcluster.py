"""A real Slurm cluster of containers for tests/slurm: controller ``ctl``, compute nodes ``n1``, ``n2``.

:class:`SlurmCluster` builds on tests/cluster's :class:`~cluster.dockerhosts.Cluster` (its key pair,
``docker exec``, shared-volume and clean-up helpers): the CPU image and ``hvdtrain:slurm`` from
docker/Dockerfile.slurm on it (Debian's slurmctld/slurmd/munge; a BuildKit cache keeps the packages,
so a rebuild takes seconds) are built once for both Docker modules (tests/cluster/images.py), makes
one MUNGE key for the cluster, and starts the three containers on a network of their own with the
shared volume at ``/shared`` on every one (writable everywhere: a batch script and rank 0 may run
on either node). The nodes also run sshd with the README's key pair, for ``horovodrun -H`` inside
an allocation. Containers, network and volume are removed at the end; the images stay.

Its own names (``hvdtrain-slurm-*``), so that tests/cluster's containers, running at the same
time in another pytest worker, are never touched.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from cluster.dockerhosts import Cluster, in_parallel

from cluster.images import SLURM_IMAGE  # noqa: E402
SLURM_PREFIX = "hvdtrain-slurm"
NODES = ("n1", "n2")
CONTROLLER = "ctl"
START = "/opt/hvdtrain/docker/slurm/start.sh"


class SlurmCluster(Cluster):
    """``ctl`` (slurmctld) and ``n1``, ``n2`` (slurmd, 4 CPUs each: small jobs side by side) from ``hvdtrain:slurm``."""

    prefix = SLURM_PREFIX  # tests/cluster's Cluster.remove, on these names only

    def __init__(self, tmp: Path):
        super().__init__(tmp)
        self.volumes = [self.volume]
        self.munge_key = tmp / "munge" / "munge.key"
        self.records: dict[int, dict[str, str]] = {}  # job id -> its last scontrol record (job, watch_jobs)

    # -- set-up -------------------------------------------------------------------------------
    def build(self) -> None:
        """The CPU image and ``hvdtrain:slurm`` on it, built from this tree once for both Docker
        modules (tests/cluster/images.py, under its lock: a module building from another tree at
        the same time waits instead of changing the image this one is built on)."""
        from cluster import images

        started = time.monotonic()
        self.docker, spent = images.ensure(("cpu", "slurm"))
        self.context, self.keys = images.CONTEXT, images.KEYS
        self.timings.update(build=time.monotonic() - started, **{f"build_{k}": v for k, v in spent.items()})

    def start(self, nodes: tuple[str, ...] = NODES, mounts: dict[str, Path] | None = None) -> None:
        """Network, shared volume, MUNGE key, ``ctl`` and the nodes (``mounts``: container path ->
        host folder, read-only on every container); returns once ``sinfo`` shows every node idle."""
        self.remove()
        self.create_network_and_volumes()
        self.munge_key.parent.mkdir(parents=True, exist_ok=True)
        self.munge_key.write_bytes(os.urandom(1024))
        env = {"HVDTRAIN_SLURM_CONTROLLER": CONTROLLER, "HVDTRAIN_SLURM_NODES": ",".join(nodes),
               "HVDTRAIN_SLURM_CPUS": "4"}
        flags = [a for k, v in {**env, "HVDTRAIN_SSHD": "1"}.items() for a in ("-e", f"{k}={v}")]
        mounted = [a for inside, outside in (mounts or {}).items() for a in ("-v", f"{outside}:{inside}:ro")]
        for name in (CONTROLLER, *nodes):
            self.hosts[name] = {"writable": True}
        in_parallel([lambda name=name: self.run(
            "run", "-d", "--name", self.container(name), "--hostname", name, "--network", self.network,
            "--network-alias", name, "--shm-size=256m", *flags, "-v", f"{self.munge_key}:/etc/hvdtrain/munge.key:ro",
            "-v", f"{self.keys}:/etc/hvdtrain/ssh:ro", "-v", f"{self.volume}:/shared", *mounted,
            SLURM_IMAGE, START, "controller" if name == CONTROLLER else "node") for name in self.hosts])
        self.wait_idle(nodes)

    def wait_idle(self, nodes: tuple[str, ...], timeout: float = 90) -> None:
        """Until ``sinfo`` on the controller lists every node in ``nodes`` as idle."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.ask("sinfo", "-h", "-N", "-o", "%N %t")
            answer = proc.stdout if proc is not None else ""
            states = dict(line.split() for line in answer.splitlines() if len(line.split()) == 2)
            if proc is not None and proc.returncode == 0 and all(states.get(n) == "idle" for n in nodes):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"Slurm nodes not idle after {timeout} s: "
                                     f"{answer}{proc.stderr if proc is not None else 'no answer'}\n"
                                     + self.logs())
            time.sleep(0.5)

    # -- use ----------------------------------------------------------------------------------
    def sbatch(self, *options: str, script: str | None = None, args: tuple[str, ...] | list[str] = (),
               env: dict[str, str] | None = None) -> int:
        """``sbatch --parsable OPTIONS [SCRIPT ARGS]`` from /shared on the controller (the login
        node; ``env`` is the submitting shell's, which the job inherits): the job id."""
        proc = self.exec(CONTROLLER, "sbatch", "--parsable", *options, *([script] if script else []), *args, env=env)
        return int(proc.stdout.strip().split(";")[0])

    def ask(self, *cmd: str) -> subprocess.CompletedProcess | None:
        """A query on the controller (``scontrol``, ``squeue``, ``sinfo``) for the polling loops: None
        when it did not answer within a minute. In the CI run of 2026-11-25 slurmctld left one
        ``scontrol show job`` unanswered for 30 s while both Docker modules set up beside the other
        test worker (load average 16); a poll that raised there ended the test, or the module's
        watcher thread, instead of asking again."""
        try:
            return self.exec(CONTROLLER, *cmd, check=False, timeout=60)
        except subprocess.TimeoutExpired:
            return None

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, NodeList, ...); once the
        controller has forgotten the job (MinJobAge after it ended), its last record that
        :meth:`job` or :meth:`watch_jobs` saw; else empty."""
        proc = self.ask("scontrol", "-o", "show", "job", str(job_id))
        if proc is not None and proc.returncode == 0 and proc.stdout.strip():
            self.records[job_id] = dict(re.findall(r"(\w+)=(\S*)", proc.stdout))
        return self.records.get(job_id, {})

    def watch_jobs(self) -> None:
        """Every job's record now (one ``scontrol show job``), kept for :meth:`job`: a job that ended
        while no test waited on it is still known after the controller forgot it."""
        proc = self.ask("scontrol", "-o", "show", "job")
        for line in proc.stdout.splitlines() if proc is not None and proc.returncode == 0 else []:
            record = dict(re.findall(r"(\w+)=(\S*)", line))
            if record.get("JobId", "").isdigit():
                self.records[int(record["JobId"])] = record

    def squeue(self, job_id: int) -> str:
        """The job's state as ``squeue`` shows it (e.g. PENDING, RUNNING); empty once it left the queue."""
        proc = self.ask("squeue", "-h", "-j", str(job_id), "-o", "%T")
        return proc.stdout.strip() if proc is not None else "UNKNOWN"

    def wait_job(self, job_id: int, timeout: float = 600, until: tuple[str, ...] = ("COMPLETED", "FAILED",
                 "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
                 ) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job's state is one of ``until``; its record."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in until:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {info.get('JobState')} after {timeout} s\n"
                                     + self.job_output(job_id)[-4000:] + self.logs())
            time.sleep(1)

    def job_output(self, job_id: int) -> str:
        """The batch script's output file (``slurm-JOBID.out`` in /shared), or ''."""
        path = self.shared() / f"slurm-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        """The tail of slurmctld's and every slurmd's log (for failure messages)."""
        parts = []
        for name in self.hosts:
            log = "slurmctld.log" if name == CONTROLLER else "slurmd.log"
            proc = self.exec(name, "tail", "-n", "25", f"/var/log/slurm/{log}", check=False, timeout=30)
            parts.append(f"--- {name}: {log}\n{proc.stdout}")
        return "\n".join(parts)
