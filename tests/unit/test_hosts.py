"""hvdtrain.launch.hosts without a cluster: -H parsing, version comparison, the workers line, SSH
errors naming the host (a name that does not resolve), host names that are not host names.
(docker/pip_relay.py: tests/unit/test_pip_relay.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hvdtrain.launch import hosts

REPO = Path(__file__).resolve().parents[2]


def test_parse_hosts_as_horovod():
    assert hosts.parse_hosts("h1:2,h2:2") == [("h1", 2), ("h2", 2)]
    assert hosts.parse_hosts("h1, h2:3") == [("h1", 1), ("h2", 3)]
    for bad in ("h1:x", "h1:0", ",", ":2"):
        with pytest.raises(ValueError, match="HOST:SLOTS"if bad not in (",",) else "no host"):
            hosts.parse_hosts(bad)


def test_mismatches_name_the_package_versions_and_hosts():
    found = {"h1": {"hvdtrain": "0.1.0", "torch": "2.13.0+cpu", "horovod": "0.28.1"},
             "h2": {"hvdtrain": "0.1.0", "torch": "2.13.0+cpu", "horovod": "0.28.1"},
             "h3": {"hvdtrain": "0.1.0", "torch": "2.12.0", "horovod": "0.28.1"}}
    assert hosts.mismatches(found) == ["torch: 2.13.0+cpu on h1, h2; 2.12.0 on h3"]
    table = hosts.format_table(found).splitlines()
    assert table[0].split() == ["host", "h1", "h2", "h3"]
    assert [line for line in table if line.startswith("*")] == [next(l for l in table if "torch" in l)]
    found["h3"]["torch"] = "2.13.0+cpu"
    assert hosts.mismatches(found) == []


def test_check_workers_lists_ranks_per_host_and_refuses_mismatches():
    same = {"hvdtrain": "0.1.0", "horovod": "0.28.1"}
    ids = [{"host": "h1", **same}, {"host": "h1", **same}, {"host": "h2", **same}, {"host": "h2", **same}]
    assert hosts.check_workers(ids) == "h1 (ranks 0-1), h2 (ranks 2-3)"
    ids[3] = {"host": "h2", "hvdtrain": "0.1.0", "horovod": "0.28.0"}
    ids[2] = dict(ids[3])
    with pytest.raises(hosts.HostError, match=r"horovod: 0.28.1 on h1; 0.28.0 on h2"):
        hosts.check_workers(ids)


def test_describe_workers_is_silent_on_one_host():
    class OneHost:
        def allgather_object(self, obj):
            return [obj, obj]

    assert hosts.describe_workers(OneHost()) is None


def test_unresolvable_host_is_named_not_waited_for():
    with pytest.raises(hosts.HostError, match=r"cannot reach host\(s\) no-such-host\.invalid over SSH on port 2222"):
        hosts.check_ssh("localhost:1,no-such-host.invalid:1", port=2222, connect_timeout=5)
    hosts.check_ssh("localhost:2")  # local names need no SSH


def test_env_json_and_hosts_on_this_machine():
    line = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "env", "--json"], capture_output=True,
                          text=True, check=True, cwd=REPO).stdout
    info = json.loads(line)
    assert set(hosts.COMPARED) <= set(info)
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "env", "--hosts", "localhost:2"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and "versions agree on all 1 host(s)" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "env", "--hosts", "localhost,no-such-host.invalid"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1 and "no-such-host.invalid" in proc.stderr and "Traceback" not in proc.stderr


def test_gloo_across_hosts_refuses_a_hostname_on_loopback(monkeypatch):
    """Horovod 0.28's Gloo process sets bind to the address of the host's name: a name on 127.x
    across hosts is named before hvd.init() aborts deep in Gloo; one host, or MPI, is not checked."""
    from hvdtrain.launch import hosts

    monkeypatch.setattr(hosts.socket, "gethostname", lambda: "node7")
    monkeypatch.setattr(hosts.socket, "gethostbyname", lambda name: "127.0.1.1")
    across = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "node7"}
    with pytest.raises(hosts.HostError, match=r"host node7: its own name resolves to 127\.0\.1\.1 \(loopback\)"):
        hosts.check_gloo_hostname(across)
    hosts.check_gloo_hostname({**across, "HOROVOD_CROSS_SIZE": "1"})  # one host: loopback is fine
    for local in ("localhost", "127.0.0.1"):  # "hosts" that are this machine (elastic over localhost, 127.0.0.1)
        hosts.check_gloo_hostname({**across, "HOROVOD_HOSTNAME": local})
    hosts.check_gloo_hostname({"OMPI_COMM_WORLD_RANK": "0", "HOROVOD_CROSS_SIZE": "2"})  # MPI: not affected
    monkeypatch.setattr(hosts.socket, "gethostbyname", lambda name: "10.0.0.7")
    hosts.check_gloo_hostname(across)


def test_a_host_name_that_is_an_ssh_option_is_refused_before_any_ssh_runs(tmp_path, monkeypatch):
    """``-oProxyCommand=...`` as a host would be an option on ssh's command line (a command run
    here): `hvdtrain env --hosts` and hvdtrain.run refuse it by name, and no ssh is started (an
    ``ssh`` first on PATH records every call)."""
    import os

    import hvdtrain

    bin_dir, calls = tmp_path / "bin", tmp_path / "ssh-calls"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 255\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    evil = f"-oProxyCommand=touch {tmp_path / 'pwned'}"
    proc = subprocess.run([sys.executable, "-m", "hvdtrain.cli", "env", f"--hosts=localhost,{evil}:2"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"hvdtrain: error: host {evil!r} is not a host name or IP address (letters, digits, '.', '-', '_', "
        f"optionally user@; not starting with '-'): refused before any ssh runs"]
    with pytest.raises(ValueError, match=r"host '-oProxyCommand=touch .*' is not a host name"):
        hvdtrain.run("image-classification", framework="torch", np=2, hosts=f"{evil}:1,localhost:1",
                     output=str(tmp_path / "out"))
    assert not calls.exists(), calls.read_text()
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()
    for bad in ("h 1", "a;b", "$(id)", "h1-", "a/b", "-p"):
        with pytest.raises(ValueError, match="is not a host name"):
            hosts.parse_hosts(f"{bad}:1")
    assert hosts.parse_hosts("user@node-1.example.com:2,10.0.0.7,my_host.") == [
        ("user@node-1.example.com", 2), ("10.0.0.7", 1), ("my_host.", 1)]


def test_the_rank_comes_from_the_launcher_that_set_it_and_is_zero_alone():
    from hvdtrain.launch import detect

    assert detect.rank({}) == 0
    assert detect.rank({"HOROVOD_RANK": "3", "SLURM_PROCID": "1"}) == 3  # horovodrun inside an allocation
    assert detect.rank({"OMPI_COMM_WORLD_RANK": "2"}) == 2 and detect.rank({"SLURM_PROCID": "5"}) == 5
    assert detect.rank({"SLURM_PROCID": "1; rm -rf /"}) == 0  # a variable from elsewhere is not trusted
