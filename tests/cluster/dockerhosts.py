"""Containers as hosts for tests/cluster: the image, a network, a shared volume, an SSH key pair.

:func:`docker_capability` says whether Docker can be used here (running, or installable as root);
:class:`Cluster` has the CPU image built with ``scripts/docker-build.sh`` (the cached Horovod
wheel reused) the way a user who followed the README does: from a copy of this tree in which the
README's key pair was made (``hvdtrain-ssh/``; the user's tree is not touched), once for both Docker
modules (tests/cluster/images.py), then starts
containers with the ``worker`` entrypoint (sshd on 2222) and that key pair as hosts ``h1``,
``h2``... on one user-defined network, and removes containers, network and volume at the end (the
image and its build cache stay, so the next run builds in seconds). :func:`key_material_in_layers`
lists what of a key pair, host keys or wheels any layer of an image holds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("HVDTRAIN_CLUSTER_IMAGE", "hvdtrain:cpu")
PREFIX = "hvdtrain-test"
SSH_PORT = 2222
#: Every command run in a container gets these. horovodrun starts a task function on each host over
#: SSH and gives them 30 s (its default start timeout) to register and probe each other's network
#: interfaces. In the CI run of 2026-11-25 the first Gloo job across h1 and h2 exited 1 after 39 s
#: with no message, while the machine's load average was 16 (the Docker set-up beside the other test
#: worker's jobs): most likely that timeout. horovodrun reports a task function's failure with
#: print() and then os._exit(), which loses the message when stdout is a pipe; unbuffered, it stays.
EXEC_ENV = {"HOROVOD_START_TIMEOUT": "120", "PYTHONUNBUFFERED": "1"}


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


def copy_tree(repo: Path, dest: Path) -> None:
    """The files git would commit (tracked, and untracked ones not ignored) of ``repo`` into ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=repo, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = repo / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def make_key_pair(folder: Path) -> None:
    """The README's step 1: ``ssh-keygen -t ed25519 -N "" -f hvdtrain-ssh/id_ed25519`` (once)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "id_ed25519").exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdtrain-test", "-f",
                        str(folder / "id_ed25519")], check=True, capture_output=True)


# names no layer may hold: sshd host keys, key pairs and their authorizations, the README's folder
KEY_NAMES = re.compile(r"(^|/)(ssh_host_\w+_key(\.pub)?|id_(rsa|dsa|ecdsa|ed25519)(\.pub)?|authorized_keys2?"
                       r"|known_hosts2?|hvdtrain-ssh)(/|$)")


def _layer_dirs(docker: str, image: str) -> list[Path] | None:
    """The folders holding each layer's own files (overlay2's ``diff`` folders, files a later layer
    deletes included), when the engine stores the image that way on this machine; else None."""
    proc = subprocess.run([docker, "image", "inspect", "-f", "{{.GraphDriver.Name}} {{json .GraphDriver.Data}}", image],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 or not proc.stdout.startswith("overlay2 "):
        return None
    data = json.loads(proc.stdout.split(" ", 1)[1])
    dirs = [Path(d) for d in (data.get("LowerDir") or "").split(":") + [data.get("UpperDir") or ""] if d]
    return dirs if dirs and all(d.is_dir() for d in dirs) else None


def _layer_members(docker: str, image: str):
    """``(layer, relative name, is a regular file, size, read())`` for every file of every layer of ``image``:
    walked in the engine's layer folders where it keeps them (overlay2), else read from ``docker save``
    (each layer's own tar), which streams the whole image (several GB) through this process."""
    dirs = _layer_dirs(docker, image)
    if dirs is not None:
        for layer in dirs:
            for top, subdirs, files in os.walk(layer):
                for name in subdirs + files:
                    path = Path(top) / name
                    rel = str(path.relative_to(layer))
                    try:
                        st = path.lstat()
                    except FileNotFoundError:
                        continue
                    is_file = stat.S_ISREG(st.st_mode)
                    yield layer.parent.name, rel, is_file, st.st_size, (lambda p=path: p.read_bytes())
        return
    proc = subprocess.Popen([docker, "save", image], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as saved:
        for entry in saved:
            if not (entry.isfile() and entry.name.endswith(".tar")):
                continue
            with tarfile.open(fileobj=saved.extractfile(entry), mode="r|") as files:
                for member in files:
                    yield (entry.name, member.name, member.isfile(), member.size,
                           (lambda m=member, f=files: f.extractfile(m).read()))
    assert proc.wait() == 0, f"docker save {image} failed"


def key_material_in_layers(docker: str, image: str, keys: Path) -> list[str]:
    """``LAYER: PATH (why)`` for every file in any layer of ``image`` (files deleted by a later layer
    count too) that is a key file by name, holds the private or public key of the pair in ``keys``,
    or is a wheel (``.whl``). Empty when the image is clean."""
    secrets = {}
    body = (keys / "id_ed25519").read_text().splitlines()[2:-1]  # the first base64 line is a common header
    secrets.update({line.encode(): "the private key" for line in body if len(line) >= 40})
    secrets[(keys / "id_ed25519.pub").read_text().split()[1].encode()] = "the public key"
    found: list[str] = []
    for layer, name, is_file, size, read in _layer_members(docker, image):
        if KEY_NAMES.search(name):
            found.append(f"{layer}: {name} (key file)")
        if name.endswith(".whl") and not name.startswith("usr/share/python-wheels/"):  # python3-venv's
            found.append(f"{layer}: {name} (wheel)")
        if is_file and size <= 1 << 20:
            data = read()
            found += [f"{layer}: {name} ({what})" for secret, what in secrets.items() if secret in data]
    return found


def in_parallel(calls: list) -> list:
    """Run the callables in threads; their results in order, or the first exception raised."""
    with ThreadPoolExecutor(max_workers=max(1, len(calls))) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


class Cluster:
    """A set of containers from one image acting as hosts; ``docker`` is the client to use. Its
    containers, network and volumes are all named ``<prefix>-...`` (a subclass with a prefix of
    its own never touches another's); ``volumes`` lists the ones :meth:`start` creates and
    :meth:`remove` removes."""

    prefix = PREFIX

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.docker = ""
        self.network = f"{self.prefix}-net"
        self.volume = f"{self.prefix}-shared"
        self.elastic_volume = f"{self.prefix}-elastic"  # writable on every host: an elastic job's rank 0 can be on any
        self.volumes = [self.volume, self.elastic_volume]
        self.context = tmp / "context"  # the build context: a copy of this tree plus the README's key pair
        self.keys = self.context / "hvdtrain-ssh"
        self.hosts: dict[str, dict] = {}
        self.timings: dict[str, float] = {}
        self.mounts: dict[str, Path] = {}  # container path -> folder of this machine, read-only on every host

    # -- set-up -------------------------------------------------------------------------------
    def build(self) -> None:
        """Start/install Docker if needed and have the CPU image built from this tree
        (tests/cluster/images.py: scripts/docker-build.sh, once per state of the tree for both Docker
        modules, from a copy of this tree where the README's key pair was made first; that key
        pair is the hosts')."""
        from cluster import images

        started = time.monotonic()
        self.docker, spent = images.ensure(("cpu",))
        self.context, self.keys = images.CONTEXT, images.KEYS
        self.timings.update(build=time.monotonic() - started, **{f"build_{k}": v for k, v in spent.items()})

    def start(self, names: list[str]) -> None:
        """The network, the shared volume, a key pair, and one worker container per name (started
        side by side; returns once ssh from the first to every one works)."""
        self.remove()
        self.create_network_and_volumes()
        self.hosts.update({name: {} for name in names})  # the first stays first (wait_ssh's origin)
        in_parallel([lambda i=index, n=name: self.add_host(n, writable=i == 0) for index, name in enumerate(names)])
        in_parallel([lambda n=name: self.wait_ssh(n) for name in names])

    def add_host(self, name: str, writable: bool = False) -> None:
        """A worker container with host name ``name``. Only the first host (rank 0's, and the
        launcher's) mounts the shared volume writable: a write from another host fails loudly.
        Every host mounts a second volume writable at /elastic: Horovod's elastic driver puts
        rank 0 on whichever host it lists first, and on a survivor after rank 0's host is lost."""
        mount = f"{self.volume}:/shared" + ("" if writable else ":ro")
        mounted = [a for inside, outside in self.mounts.items() for a in ("-v", f"{outside}:{inside}:ro")]
        self.run("run", "-d", "--name", self.container(name), "--hostname", name, "--network", self.network,
                 "--network-alias", name, "--shm-size=256m", "-v", f"{self.keys}:/etc/hvdtrain/ssh:ro",
                 "-v", mount, "-v", f"{self.elastic_volume}:/elastic", *mounted, IMAGE, "worker")
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
            time.sleep(0.5)

    def create_network_and_volumes(self) -> None:
        """The network, every volume of ``volumes`` and the key pair (after :meth:`remove`)."""
        self.run("network", "create", self.network)
        for volume in self.volumes:
            self.run("volume", "create", volume)
        make_key_pair(self.keys)

    # -- use ----------------------------------------------------------------------------------
    def container(self, name: str) -> str:
        """The container name of host ``name``."""
        return f"{self.prefix}-{name}"

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """``docker ARGS``."""
        proc = subprocess.run([self.docker, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc

    def exec(self, host: str, *cmd: str, check: bool = True, timeout: float = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``cmd`` in host ``host``'s container (from /shared), with :data:`EXEC_ENV` under ``env``."""
        flags = [a for k, v in {**EXEC_ENV, **(env or {})}.items() for a in ("-e", f"{k}={v}")]
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
        listed = self.run("ps", "-aq", "--filter", f"name=^{self.prefix}-", check=False).stdout.split()
        if listed:
            self.run("rm", "-f", *listed, check=False)
        self.run("network", "rm", self.network, check=False)
        self.run("volume", "rm", "-f", *self.volumes, check=False)
        self.hosts.clear()
