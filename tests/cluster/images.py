"""The Docker images of tests/cluster and tests/slurm, built once per state of the tree for both.

:func:`ensure` makes a Docker engine usable (scripts/docker-daemon.sh), then, under a lock
(:data:`LOCK`), builds what is asked and not yet built from this state of the tree: the CPU image
(``hvdtrain:cpu``, scripts/docker-build.sh, the cached Horovod wheel reused) and, on it, the Slurm
image (``hvdtrain:slurm``, docker/Dockerfile.slurm). It builds from one copy of the tree (the files
git would commit) in :data:`HOME`/context, where the README's key pair (``hvdtrain-ssh/``) is made
first, the way a user who followed the README builds; both modules' containers use that key pair.
A stamp (:data:`HOME`/stamp.json) records what was built from which tree (a digest of every file's
name and content, and of the Horovod/mpi4py wheel folders offered to the build) and the image ids;
a later call from the same tree, with the images unchanged, builds nothing and returns at once.

Before, each module built for itself at its start: the two modules, handed out first, side by side,
each spent its first minutes (348 s and 361 s on a fresh machine on 2026-11-27) waiting on the
same builds while neither pytest worker ran anything else. Now ``make test`` starts this file
(``python tests/cluster/images.py``) in the background as the session starts (tests/conftest.py),
and the two modules are handed out after the first ones; they find the images built, or wait on
the lock for the build to end.

    python tests/cluster/images.py [cpu|slurm ...]    # default: both; log on standard error
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: tests/ on the path for ``cluster.dockerhosts``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster.dockerhosts import IMAGE, REPO, copy_tree, make_key_pair  # noqa: E402

SLURM_IMAGE = os.environ.get("HVDTRAIN_SLURM_IMAGE", "hvdtrain:slurm")
HOME = Path(os.environ.get("HVDTRAIN_DOCKER_IMAGES_HOME", "/tmp/hvdtrain-docker-images"))
LOCK = HOME.with_name(HOME.name + ".lock")
CONTEXT = HOME / "context"
KEYS = CONTEXT / "hvdtrain-ssh"  # the README's key pair, made in the build context before the build
STAMP = HOME / "stamp.json"
LOG = HOME / "build.log"  # the last build's output (docker-build.sh, then the Slurm image)
WHAT = ("cpu", "slurm")  # the Slurm image is built on the CPU image


def tree_digest(repo: Path = REPO) -> str:
    """A digest of the files git would commit (name and content) and of the wheel folders that
    scripts/docker-build.sh offers to the build: what decides the images."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=repo, check=True,
                            capture_output=True).stdout.decode().split("\0")
    digest = hashlib.sha256()
    for name in sorted(filter(None, listed)):
        path = repo / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    cache = Path(os.environ.get("HVDTRAIN_CACHE", Path.home() / ".cache" / "hvdtrain")) / "wheels"
    for folder in sorted(cache.glob("horovod-*")) + sorted(cache.glob("mpi4py-*")):
        if ".tmp" not in folder.name:
            digest.update(b"wheels\0" + folder.name.encode())
    return digest.hexdigest()


def image_id(docker: str, tag: str) -> str | None:
    """The id of image ``tag``, or None when there is none."""
    proc = subprocess.run([docker, "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True,
                          timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else None


def docker_client() -> str:
    """The client that builds with BuildKit, after scripts/docker-daemon.sh made an engine usable."""
    proc = subprocess.run(["bash", "scripts/docker-daemon.sh"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _built(docker: str, digest: str, wanted: tuple[str, ...]) -> bool:
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return False
    tags = {"cpu": IMAGE, "slurm": SLURM_IMAGE}
    return stamp.get("digest") == digest and all(
        stamp.get("images", {}).get(what) and stamp["images"][what] == image_id(docker, tags[what]) for what in wanted)


def _fresh_context() -> None:
    """The build context: this tree's files, and the key pair kept from an earlier build (containers
    of a module still running may mount it)."""
    CONTEXT.mkdir(parents=True, exist_ok=True)
    for entry in CONTEXT.iterdir():
        if entry != KEYS:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    copy_tree(REPO, CONTEXT)
    make_key_pair(KEYS)


def ensure(wanted: tuple[str, ...] = WHAT) -> tuple[str, dict[str, float]]:
    """The docker client, once the images in ``wanted`` are built from this tree (see the module
    docstring), and the seconds spent: waiting on the lock, building."""
    wanted = tuple(w for w in WHAT if w in wanted or (w == "cpu" and "slurm" in wanted))
    docker = docker_client()
    HOME.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.monotonic()
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        timings["waited"] = time.monotonic() - started
        digest = tree_digest()
        if _built(docker, digest, wanted):
            timings["built"] = 0.0
            make_key_pair(KEYS)
            return docker, timings
        started = time.monotonic()
        _fresh_context()
        steps = {"cpu": ["bash", "scripts/docker-build.sh", IMAGE],
                 "slurm": [docker, "build", "-f", "docker/Dockerfile.slurm", "--build-arg", f"BASE_IMAGE={IMAGE}",
                           "-t", SLURM_IMAGE, "--progress=plain", "."]}
        images = {}
        with open(LOG, "w") as out:
            for what in wanted:
                out.write(f"[hvdtrain test images] {' '.join(steps[what])}\n")
                out.flush()
                proc = subprocess.run(steps[what], cwd=CONTEXT, stdout=out, stderr=subprocess.STDOUT,
                                      env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=2400)
                assert proc.returncode == 0, f"{what} image build failed:\n" + LOG.read_text()[-6000:]
                images[what] = image_id(docker, IMAGE if what == "cpu" else SLURM_IMAGE)
        STAMP.write_text(json.dumps({"digest": digest, "images": images}))
        timings["built"] = time.monotonic() - started
    return docker, timings


if __name__ == "__main__":
    begun = time.monotonic()
    _, spent = ensure(tuple(sys.argv[1:]) or WHAT)
    print(f"[hvdtrain test images] ready in {time.monotonic() - begun:.0f} s "
          f"(waited {spent['waited']:.0f} s, built {spent['built']:.0f} s)", file=sys.stderr)
