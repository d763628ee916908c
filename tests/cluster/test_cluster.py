"""Multi-host jobs for real: containers from the CPU image as hosts h1, h2 (sshd on 2222, one key
pair, a shared volume), launched from h1 over SSH.

* ``horovodrun -np 4 -H h1:2,h2:2 -p 2222 --mpi`` (the `hvdtrain recipe` command line run by
  workers/cli_ranks.py, which then compares every rank's parameters), torch; TensorFlow on MPI
  across hosts is tests/slurm's ``srun --mpi=pmix`` job (two hosts, bitwise equal to the Gloo job;
  its own 4-rank job here repeated that and was folded on 2026-11-28);
* ``hvdtrain.run(..., np=4, hosts="h1:2,h2:2", ssh_port=2222)`` from Python: Horovod's own launch
  (what ``horovodrun -H ... --gloo`` runs) of the `hvdtrain recipe` command over Gloo, TensorFlow;
  torch over Gloo across the hosts is the elastic case's (a torch `horovodrun --gloo -H` job of its
  own repeated what these two prove and was folded into them on 2026-11-27);
* elastic: a host-discovery script over h1 and h2, launched from a third container h0 outside
  it (Horovod may put rank 0 on either host), ``docker kill`` of the host without rank 0
  mid-epoch, the survivors continue, the host is started again and rejoins, the run finishes all
  epochs (its output on a volume every host mounts writable);
* ``hvdtrain env --hosts`` on every host; a host with another hvdtrain version named before
  training; a host that does not answer SSH named in an error instead of a hang;
* no credentials in the image: built after the README's key pair was made in the build context, no
  layer holds it, an sshd host key or a staged wheel; every container makes its own host keys and
  ssh trusts only host keys certified by the job's key pair.

In the fixed-host cases only h1 (rank 0's host) mounts the shared volume writable, so a write
from another host fails the job. Needs Docker (started, or installed with apt-get as root): under
CI=true a missing capability fails; elsewhere the module skips with the reason. The image is built once by
scripts/docker-build.sh (the cached Horovod wheel reused); containers, network and volume are
removed at the end, the image is kept.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

from cluster.dockerhosts import IMAGE, SSH_PORT, Cluster, docker_capability, key_material_in_layers

WHY_NOT = docker_capability()
if WHY_NOT and os.environ.get("CI") == "true":
    raise RuntimeError(f"tests/cluster must run in CI but cannot: {WHY_NOT}")
# the first test also builds the image: minutes with the cached Horovod wheel, longer without
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(2400),
              pytest.mark.skipif(bool(WHY_NOT), reason=f"no Docker: {WHY_NOT}")]

DATA = "/data/mnist-imagefolder"  # this machine's embedded MNIST, mounted read-only on every host (a shared file system)
# 256 samples / 4 ranks / batch 32 = 2 steps per epoch, 2 epochs: ranks on both hosts, one metrics
# line per epoch, a checkpoint per epoch and identical parameters need no more (was 1,024 and 256)
TRAIN = ["--data", DATA, "--batch-size", "32", "--set", "data.max_train_samples=256",
         "--set", "data.max_val_samples=64", "--set", "train.log_every=0"]
WORKERS_LINE = "hvdtrain: workers on h1 (ranks 0-1), h2 (ranks 2-3)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from hvdtrain.data.mnist import embedded_mnist

    hosts = Cluster(tmp_path_factory.mktemp("cluster"))
    hosts.build()
    try:
        hosts.mounts = {DATA: embedded_mnist()}  # written once per machine, not per run
        hosts.start(["h1", "h2"])
        yield hosts
    finally:
        hosts.remove()


def metrics(cluster: Cluster, name: str, volume: str | None = None) -> list[dict]:
    path = cluster.shared(volume) / "runs" / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_consistent_checkpoint(cluster: Cluster, name: str, epochs: int, volume: str | None = None) -> dict:
    """The newest checkpoint on the shared volume matches its checksums and has all epochs."""
    from hvdtrain.core.checkpoint import CheckpointManager

    folders = sorted(p for p in (cluster.shared(volume) / "runs" / name / "checkpoints").iterdir()
                     if p.is_dir() and not p.name.startswith("."))
    infos = [CheckpointManager.read(p, verify=True) for p in folders]
    assert infos and all(infos), folders
    newest = max(infos, key=lambda i: i.step)
    assert newest.epoch == epochs, newest.manifest
    return newest.manifest


def assert_trained_once(cluster: Cluster, name: str, stdout: str, epochs: int = 2, world: int = 4) -> None:
    rows = metrics(cluster, name)
    assert [r["epoch"] for r in rows] == list(range(1, epochs + 1)), rows  # written once, by rank 0
    assert rows[-1]["world_size"] == world
    assert stdout.count("hvdtrain: done") == 1, stdout[-3000:]
    assert_consistent_checkpoint(cluster, name, epochs)


def test_env_compares_every_host(cluster):
    proc = cluster.exec("h1", "hvdtrain", "env", "--hosts", "h1:2,h2:2", "-p", str(SSH_PORT))
    assert "versions agree on all 2 host(s)" in proc.stdout, proc.stdout
    header = proc.stdout.splitlines()[0].split()
    assert header == ["host", "h1", "h2"], proc.stdout


def test_image_layers_hold_no_key_and_no_wheel(cluster):
    """The image was built as by a user who followed the README: ``hvdtrain-ssh/`` (root's
    authorized key on every worker) made in the build context first. No layer (files a later layer
    deletes included) holds that key pair, an sshd host key, an authorized_keys or known_hosts file,
    or the Horovod wheels docker/wheels offered to the install step."""
    found = key_material_in_layers(cluster.docker, IMAGE, cluster.keys)
    assert not found, "key material or wheels in the image's layers:\n" + "\n".join(found)


def test_each_host_has_its_own_host_keys_and_only_certified_hosts_are_trusted(cluster):
    prints = {h: cluster.exec(h, "ssh-keygen", "-lf", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
              for h in ("h1", "h2")}
    assert prints["h1"] != prints["h2"], prints  # made at each container's start, not in the image
    # a host key the job's key pair did not certify (an impostor's sshd, here on h2:2223) is refused
    cluster.exec("h2", "bash", "-c", "ssh-keygen -q -t ed25519 -N '' -f /tmp/impostor "
                 "&& /usr/sbin/sshd -p 2223 -h /tmp/impostor -o PidFile=/tmp/impostor.pid")
    try:
        proc = cluster.exec("h1", "ssh", "-p", "2223", "h2", "hostname", check=False, timeout=60)
        assert proc.returncode != 0 and "Host key verification failed" in proc.stderr, proc.stdout + proc.stderr
    finally:
        cluster.exec("h2", "bash", "-c", "kill $(cat /tmp/impostor.pid)", check=False)
    assert cluster.exec("h1", "ssh", "-p", str(SSH_PORT), "h2", "hostname").stdout.strip() == "h2"


@pytest.mark.parametrize("framework", ["torch"])
def test_horovodrun_mpi_across_hosts_parameters_identical(cluster, framework):
    name = f"mpi-{framework}"
    report = f"/shared/runs/{name}.ranks.json"
    proc = cluster.exec("h1", "horovodrun", "-np", "4", "-H", "h1:2,h2:2", "-p", str(SSH_PORT), "--mpi",
                        "--network-interfaces", "eth0",
                        "python", "/opt/hvdtrain/tests/cluster/workers/cli_ranks.py", report, framework, "--",
                        "recipe", "image-classification", "--framework", framework, "--epochs", "2",
                        "--output", f"/shared/runs/{name}", *TRAIN, timeout=600)
    assert WORKERS_LINE in proc.stdout, proc.stdout[-3000:]
    assert_trained_once(cluster, name, proc.stdout)
    ranks = json.loads((cluster.shared() / "runs" / f"{name}.ranks.json").read_text())["ranks"]
    assert [r["host"] for r in ranks] == ["h1", "h1", "h2", "h2"], ranks
    assert len({r["params_sha256"] for r in ranks}) == 1, ranks  # bitwise identical on every rank


def test_python_api_across_hosts(cluster):
    """``hvdtrain.run`` from a notebook on h1 (Horovod's Gloo controller): TensorFlow across hosts."""
    code = ("import json, hvdtrain\n"
            "r = hvdtrain.run('image-classification', framework='tensorflow', np=4, hosts='h1:2,h2:2', ssh_port=2222,\n"
            f"    output='/shared/runs/api', data__path='{DATA}', train__epochs=2, train__batch_size=32,\n"
            "    data__max_train_samples=256, data__max_val_samples=64, train__log_every=0)\n"
            "print('RESULT', json.dumps({'epochs': [h['epoch'] for h in r.history], 'checkpoint': str(r.checkpoint)}))\n")
    proc = cluster.exec("h1", "python", "-c", code, timeout=600)
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["epochs"] == [1, 2] and result["checkpoint"].startswith("/shared/runs/api/checkpoints/")
    assert WORKERS_LINE in proc.stdout, proc.stdout[-3000:]
    assert_trained_once(cluster, "api", proc.stdout)


DISCOVER = """#!/bin/bash
# hosts whose sshd answers, 2 slots each (Horovod calls this every second)
for h in h1 h2; do
  if timeout 1 bash -c "exec 3<>/dev/tcp/$h/2222" 2>/dev/null; then echo "$h:2"; fi
done
"""


def test_elastic_host_killed_then_rejoins(cluster):
    """Horovod's elastic driver orders the hosts it discovers at random (a set), so rank 0 may be
    on h1 or h2: the output is on /elastic, writable on every host (README: elastic jobs need an
    output directory every host can write). The job is launched from h0, a host outside the
    discovery script (a login node), and the host without rank 0 is killed, so every run follows
    the same path."""
    cluster.exec("h1", "bash", "-c", f"cat > /shared/discover.sh <<'EOF'\n{DISCOVER}EOF\nchmod +x /shared/discover.sh")
    cluster.add_host("h0")
    cluster.wait_ssh("h0")
    # 2,048 samples / 4 ranks / batch 16 = 32 steps per epoch; a host dies at rank 0's step 8. While
    # the 2 survivors (64 steps per epoch) work alone, rank 0 sleeps 300 ms a step (size=2), so they
    # still train when the host is back (restart, sshd, Horovod's 1-2 s blacklist cool-down: the
    # discovery script lists a host only once its sshd answers); once it has rejoined, the 4 train at
    # full speed. Every step of the test waits on an event (a line of the job's output), none on a clock.
    proc = cluster.popen("h0", "horovodrun", "-np", "4", "--min-np", "2", "--max-np", "4", "-p", str(SSH_PORT),
                         "--host-discovery-script", "/shared/discover.sh", "--blacklist-cooldown-range", "1", "2",
                         "hvdtrain", "recipe", "image-classification", "--framework", "torch", "--elastic",
                         "--epochs", "3", "--output", "/elastic/runs/elastic", "--data", DATA, "--batch-size", "16",
                         "--set", "data.max_train_samples=2048", "--set", "data.max_val_samples=256",
                         "--set", "train.log_every=4", "--set", "train.elastic_commit_every=2",
                         "--set", "train.stall_timeout_sec=120",
                         env={"HVDTRAIN_FAULT": "slow:rank=0:step=6:ms=300:size=2"})
    lines: list[str] = []
    events: dict[str, float] = {}
    hosts: dict[str, str] = {}
    started = time.monotonic()

    def read():
        for line in proc.stdout:
            lines.append(line)
            found = re.search(r"hvdtrain: workers on (h\d) \(ranks 0-1\), (h\d) \(ranks 2-3\)", line)
            if found and not hosts:
                hosts["rank0"], hosts["victim"] = found.groups()
                events["trains"] = time.monotonic() - started
            if "re-formed with 4 worker(s)" in line and "restarted" in events:
                events.setdefault("rejoined", time.monotonic() - started)
            if "killed" not in events and hosts and re.search(r"epoch 1/3 step (8|12|16)/", line):
                cluster.run("kill", cluster.container(hosts["victim"]))
                events["killed"] = time.monotonic() - started
            elif "killed" in events and "restarted" not in events and "re-formed with 2 worker(s)" in line:
                cluster.run("start", cluster.container(hosts["victim"]))
                events["restarted"] = time.monotonic() - started

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=540)
    except Exception:
        proc.kill()
        raise
    finally:
        reader.join(timeout=30)
    out = "".join(lines)
    events["done"] = time.monotonic() - started
    print("elastic timeline (s):", {k: round(v, 1) for k, v in events.items()})  # shown by pytest -rP
    assert proc.returncode == 0, out[-6000:]
    assert "killed" in events and "restarted" in events, (events, out[-6000:])
    assert "re-formed with 2 worker(s)" in out and "re-formed with 4 worker(s)" in out, out[-6000:]
    assert f"hvdtrain: workers on {hosts['rank0']} (ranks 0-1)" in out.split("re-formed with 2 worker(s)")[1], \
        out[-6000:]  # the survivors only, then both hosts again
    assert out.count("hvdtrain: workers on") >= 2, out[-6000:]  # at the start and after the rejoin
    rows = metrics(cluster, "elastic", cluster.elastic_volume)
    assert [r["epoch"] for r in rows] == [1, 2, 3], rows
    assert rows[-1]["world_size"] == 4, rows
    assert out.count("hvdtrain: done") == 1
    assert_consistent_checkpoint(cluster, "elastic", 3, cluster.elastic_volume)
    cluster.wait_ssh(hosts["victim"])
    cluster.run("rm", "-f", cluster.container("h0"))
    del cluster.hosts["h0"]


def test_mismatched_and_unreachable_hosts_are_named(cluster):
    cluster.add_host("h3")  # read-only shared volume, like h2
    cluster.wait_ssh("h3")
    cluster.exec("h3", "sed", "-i", 's/^__version__ = "\\(.*\\)"/__version__ = "\\1.other"/',
                 "/opt/hvdtrain/hvdtrain/_version.py")
    env = cluster.exec("h1", "hvdtrain", "env", "--hosts", "h1,h3", "-p", str(SSH_PORT), check=False)
    assert env.returncode == 1 and "version mismatch across hosts: hvdtrain: " in env.stderr, env.stderr
    assert re.search(r"hvdtrain: \S+ on h1; \S+\.other on h3", env.stderr), env.stderr

    job = cluster.exec("h1", "horovodrun", "-np", "2", "-H", "h1:1,h3:1", "-p", str(SSH_PORT), "--gloo",
                       "hvdtrain", "recipe", "image-classification", "--epochs", "1",
                       "--output", "/shared/runs/mismatch", *TRAIN, check=False, timeout=300)
    assert job.returncode != 0
    assert "the hosts of this job run different versions" in job.stdout + job.stderr
    assert not (cluster.shared() / "runs" / "mismatch" / "metrics.jsonl").exists()

    cluster.run("pause", cluster.container("h3"))  # TCP still connects, sshd never answers
    try:
        code = ("import hvdtrain\n"
                "from hvdtrain.launch.hosts import HostError\n"
                "try:\n"
                "    hvdtrain.run('image-classification', framework='torch', np=2, hosts='h1:1,h3:1', ssh_port=2222,\n"
                "                 output='/shared/runs/unreachable', train__epochs=1)\n"
                "except HostError as e:\n"
                "    print('HOSTERROR', e)\n")
        # a hang (horovodrun waiting on h3) fails on the call's timeout; HostError (hvdtrain's own
        # check, before horovodrun) is the witness, not the wall-clock time
        proc = cluster.exec("h1", "python", "-c", code, timeout=120)
        assert "HOSTERROR cannot reach host(s) h3 over SSH on port 2222" in proc.stdout, proc.stdout + proc.stderr
        assert not (cluster.shared() / "runs" / "unreachable").exists()
    finally:
        cluster.run("unpause", cluster.container("h3"), check=False)
