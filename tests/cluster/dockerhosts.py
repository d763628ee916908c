"""Containers as hosts for tests/cluster: the image, a network, a shared volume, an SSH key pair.

:func:`docker_capability` says whether Docker can be used here (running, or installable as root);
:class:`Cluster` builds the CPU image once with ``scripts/docker-build.sh`` (the cached Horovod
wheel reused), then starts containers with the ``worker`` entrypoint (sshd on 2222) as hosts
``h1``, ``h2``... on one user-defined network, and removes containers, network and volume at the
end (the image and its build cache stay, so the next run builds in seconds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("HVDTRAIN_CLUSTER_IMAGE", "hvdtrain:cpu")
PREFIX = "hvdtrain-test"
SSH_PORT = 2222


def docker_capability() -> str | None:
    """None if Docker can be used (an engine answers, or root can install/start docker.io), else why not."""
    for client in ("docker", "/usr/bin/docker"):
        exe = shutil.which(client)
        if exe and subprocess.run([exe, "info"], capture_output=True, timeout=30).returncode == 0:
            return None
    if os.geteuid() != 0:
        return "no Docker engine is running and starting or installing one needs root"
    if shutil.which("dockerd") or Path("/usr/sbin/dockerd").exists() or shutil.which("apt-get"):
        return None
    return "no Docker engine, no dockerd and no apt-get to install docker.io"


class Cluster:
    """A set of containers from one image acting as hosts; ``docker`` is the client to use."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.docker = ""
        self.network = f"{PREFIX}-net"
        self.volume = f"{PREFIX}-shared"
        self.elastic_volume = f"{PREFIX}-elastic"  # writable on every host: an elastic job's rank 0 can be on any
        self.keys = tmp / "ssh"
        self.hosts: dict[str, dict] = {}
        self.timings: dict[str, float] = {}

    # -- set-up -------------------------------------------------------------------------------
    def build(self) -> None:
        """Start/install Docker if needed and build the image (one command: scripts/docker-build.sh)."""
        started = time.monotonic()
        proc = subprocess.run(["bash", "scripts/docker-daemon.sh"], cwd=REPO, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr
        self.docker = proc.stdout.strip()
        log = self.tmp / "docker-build.log"
        with open(log, "w") as out:
            proc = subprocess.run(["bash", "scripts/docker-build.sh", IMAGE], cwd=REPO, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=2400)
        assert proc.returncode == 0, "image build failed:\n" + log.read_text()[-6000:]
        self.timings["build"] = time.monotonic() - started

    def start(self, names: list[str]) -> None:
        """The network, the shared volume, a key pair, and one worker container per name."""
        self.remove()
        self.run("network", "create", self.network)
        self.run("volume", "create", self.volume)
        self.run("volume", "create", self.elastic_volume)
        self.keys.mkdir(parents=True, exist_ok=True)
        if not (self.keys / "id_ed25519").exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdtrain-test", "-f",
                            str(self.keys / "id_ed25519")], check=True, capture_output=True)
        for index, name in enumerate(names):
            self.add_host(name, writable=index == 0)
        for name in names:
            self.wait_ssh(name)

    def add_host(self, name: str, writable: bool = False) -> None:
        """A worker container with host name ``name``. Only the first host (rank 0's, and the
        launcher's) mounts the shared volume writable: a write from another host fails loudly.
        Every host mounts a second volume writable at /elastic: Horovod's elastic driver puts
        rank 0 on whichever host it lists first, and on a survivor after rank 0's host is lost."""
        mount = f"{self.volume}:/shared" + ("" if writable else ":ro")
        self.run("run", "-d", "--name", self.container(name), "--hostname", name, "--network", self.network,
                 "--network-alias", name, "--shm-size=256m", "-v", f"{self.keys}:/etc/hvdtrain/ssh:ro",
                 "-v", mount, "-v", f"{self.elastic_volume}:/elastic", IMAGE, "worker")
        self.hosts[name] = {"writable": writable}

    def wait_ssh(self, name: str, timeout: float = 60) -> None:
        """Until ``ssh -p 2222 name`` from the first host works."""
        first = next(iter(self.hosts))
        deadline = time.monotonic() + timeout
        while True:
            proc = self.exec(first, "ssh", "-p", str(SSH_PORT), "-o", "ConnectTimeout=5", name, "hostname",
                             check=False, timeout=30)
            if proc.returncode == 0 and proc.stdout.strip() == name:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"ssh to {name} did not work: {proc.stdout}{proc.stderr}")
            time.sleep(1)

    # -- use ----------------------------------------------------------------------------------
    @staticmethod
    def container(name: str) -> str:
        return f"{PREFIX}-{name}"

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """``docker ARGS``."""
        proc = subprocess.run([self.docker, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc

    def exec(self, host: str, *cmd: str, check: bool = True, timeout: float = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``cmd`` in host ``host``'s container (from /shared)."""
        flags = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
        proc = subprocess.run([self.docker, "exec", "-w", "/shared", *flags, self.container(host), *cmd],
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} on {host} exited {proc.returncode}\n--- stdout\n"
                                 f"{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-8000:]}")
        return proc

    def popen(self, host: str, *cmd: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``cmd`` in ``host``'s container, output (stdout and stderr) as one text stream."""
        flags = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
        return subprocess.Popen([self.docker, "exec", "-w", "/shared", *flags, self.container(host), *cmd],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def shared(self, volume: str | None = None) -> Path:
        """The shared (or another) volume's folder on this machine (read directly by the tests)."""
        return Path(self.run("volume", "inspect", volume or self.volume, "--format",
                             "{{.Mountpoint}}").stdout.strip())

    # -- clean-up -----------------------------------------------------------------------------
    def remove(self) -> None:
        """Remove this module's containers, network and volume (left by an earlier run too)."""
        if not self.docker:
            return
        listed = self.run("ps", "-aq", "--filter", f"name=^{PREFIX}-", check=False).stdout.split()
        if listed:
            self.run("rm", "-f", *listed, check=False)
        self.run("network", "rm", self.network, check=False)
        self.run("volume", "rm", "-f", self.volume, self.elastic_volume, check=False)
        self.hosts.clear()
