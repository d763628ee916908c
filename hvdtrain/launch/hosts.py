"""The hosts of a multi-host job: parse ``-H``, reach them over SSH, compare their versions.

Used before a job starts (:func:`hvdtrain.run` with ``hosts``, ``hvdtrain env --hosts``) and at
its start (:func:`check_workers`, every rank's identity gathered once): a host that SSH cannot
reach, or one with another hvdtrain, framework or Horovod version, is named in a one-line error
instead of a hang or a crash deep inside Horovod.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

LOCAL_NAMES = ("localhost", "127.0.0.1")
# what must agree across the hosts of one job (keys of environment.versions())
COMPARED = ("hvdtrain", "python", "torch", "tensorflow", "keras", "horovod")
# a DNS name (letters, digits, '-', '_', dots; no label starts or ends with '-') with an optional
# ``user@``: what ssh gets as its destination; anything else (a leading '-' is an ssh option such as
# -oProxyCommand=..., which runs a command here) is refused before any ssh runs
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"(?:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,31}}@)?{_LABEL}(?:\.{_LABEL})*\.?")


class HostError(RuntimeError):
    """A host of the job cannot be used: unreachable over SSH, or with different versions."""


def check_gloo_hostname(environ: dict[str, str] | None = None) -> None:
    """Before ``hvd.init()`` of a Gloo worker in a job across hosts: this host's own name must not
    resolve to a loopback address, else a :class:`HostError` naming it.

    Horovod 0.28 builds its process-set Gloo contexts (the global process set's included, during
    ``hvd.init()``) on the address of the host's name: ``GlooContext::InitializeForProcessSet``
    ignores ``HOROVOD_GLOO_IFACE`` (``--network-interfaces``). Where the name resolves to
    127.0.x.x (Debian's ``/etc/hosts`` maps it to 127.0.1.1) the workers of other hosts are sent
    to their own loopback and ``hvd.init()`` aborts with "connect [127.0.0.1]: Connection
    refused". One host and MPI jobs are not affected, nor is a worker its launcher addressed by a
    local name (``localhost``, ``127.x``): that job's "hosts" are this machine (as in an elastic
    run over ``localhost`` and ``127.0.0.1``)."""
    env = os.environ if environ is None else environ
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in env or int(env.get("HOROVOD_CROSS_SIZE", "1") or 1) <= 1:
        return
    launched_as = env.get("HOROVOD_HOSTNAME", "")
    if is_local(launched_as) or is_loopback(launched_as):
        return
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError as e:
        raise HostError(f"host {name}: its own name does not resolve ({e}); Horovod's Gloo workers on several "
                        f"hosts connect to the address of each host's name: add it to DNS or /etc/hosts") from None
    if is_loopback(address):
        raise HostError(f"host {name}: its own name resolves to {address} (loopback), so workers on the other hosts "
                        f"cannot connect to it: Horovod 0.28's Gloo process sets use the address of the host's name, "
                        f"whatever --network-interfaces says. Map {name} to an address the other hosts reach "
                        f"(DNS, or /etc/hosts instead of 127.0.1.1), or launch with --mpi")


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """``"h1:2,h2:2"`` -> ``[("h1", 2), ("h2", 2)]`` (slots default to 1), as Horovod's ``-H``."""
    result = []
    for item in [part.strip() for part in str(hosts).split(",") if part.strip()]:
        name, _, slots = item.partition(":")
        if not name or (slots and not slots.isdigit()) or (slots and int(slots) < 1):
            raise ValueError(f"hosts={hosts!r}: {item!r} is not HOST or HOST:SLOTS with SLOTS >= 1 "
                             f"(e.g. 'host1:4,host2:4')")
        check_host_name(name)
        result.append((name, int(slots or 1)))
    if not result:
        raise ValueError(f"hosts={hosts!r}: no host given (e.g. 'host1:4,host2:4')")
    return result


def check_host_name(name: str) -> None:
    """Refuse (ValueError naming it) a host name that is neither a plausible DNS name (optionally
    ``user@name``) nor an IP address: it would reach ssh's command line, where ``-o...`` is an option."""
    address = name.rsplit("@", 1)[-1]
    try:
        ipaddress.ip_address(address)
        plausible = _HOST_NAME.fullmatch(name.replace(address, "h")) is not None
    except ValueError:
        plausible = len(address) <= 253 and _HOST_NAME.fullmatch(name) is not None
    if not plausible:
        raise ValueError(f"host {name!r} is not a host name or IP address (letters, digits, '.', '-', '_', "
                         f"optionally user@; not starting with '-'): refused before any ssh runs")


def is_local(host: str) -> bool:
    """True for the names Horovod starts workers on without SSH."""
    return host in LOCAL_NAMES


def is_loopback(address: str) -> bool:
    """True for a loopback address (127.x.x.x, ``::1``)."""
    return address.startswith("127.") or address == "::1"


def ssh_command(host: str, command: str, port: int | None = None, identity: str | None = None,
                connect_timeout: int = 10) -> list[str]:
    """``ssh`` without a password or host-key prompt, with a connect timeout. Host keys are checked
    as the user's ssh configuration says (the images trust hosts certified by the job's key pair): a
    host whose key ssh does not know fails naming it, never silently accepted."""
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}"]
    if port:
        cmd += ["-p", str(port)]
    if identity:
        cmd += ["-i", identity]
    return [*cmd, host, command]


def run_on_hosts(hosts: list[str], command: str, port: int | None = None, identity: str | None = None,
                 connect_timeout: int = 10, timeout: float = 120) -> dict[str, subprocess.CompletedProcess]:
    """Run a shell ``command`` on every host at once (local names without SSH); host -> result.
    A host that SSH cannot reach raises :class:`HostError` naming it (and every other such host)."""

    def one(host: str) -> subprocess.CompletedProcess:
        argv = ["bash", "-c", command] if is_local(host) else ssh_command(host, command, port, identity,
                                                                           connect_timeout)
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 255, "", f"no answer within {timeout:g} s")
        except FileNotFoundError:
            raise HostError("ssh is not installed here: multi-host jobs start their workers over SSH") from None

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        results = dict(zip(hosts, pool.map(one, hosts)))
    # ssh itself exits 255 on connection or authentication failures; the command's own codes pass
    unreachable = {h: r for h, r in results.items() if r.returncode == 255 and not is_local(h)}
    if unreachable:
        port_text = f" on port {port}" if port else ""
        details = "; ".join(f"{h}: {_last_line(r.stderr) or 'ssh failed'}" for h, r in unreachable.items())
        names = ", ".join(unreachable)
        raise HostError(f"cannot reach host(s) {names} over SSH{port_text} ({details}). Every host of the job "
                        f"must accept `ssh{' -p ' + str(port) if port else ''} HOST` from here without a password "
                        f"(docs/guides/docker.md: Several machines)")
    return results


def check_ssh(hosts: str, port: int | None = None, identity: str | None = None, connect_timeout: int = 10) -> None:
    """Raise :class:`HostError` naming every host of ``hosts`` (``"h1:2,h2:2"``) that SSH cannot reach."""
    names = [name for name, _ in parse_hosts(hosts) if not is_local(name)]
    if names:
        run_on_hosts(names, "true", port, identity, connect_timeout)


def host_versions(hosts: str, port: int | None = None, identity: str | None = None,
                  connect_timeout: int = 10) -> dict[str, dict[str, str]]:
    """``hvdtrain env --json`` on every host (this interpreter's path, as Horovod assumes the same
    environment everywhere): host -> its versions."""
    names = list(dict.fromkeys(name for name, _ in parse_hosts(hosts)))
    command = f"{shlex.quote(sys.executable)} -m hvdtrain.cli env --json"
    results = run_on_hosts(names, command, port, identity, connect_timeout)
    versions = {}
    for host, result in results.items():
        try:
            versions[host] = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise HostError(f"host {host}: `{command}` failed (exit {result.returncode}): "
                            f"{_last_line(result.stderr) or _last_line(result.stdout) or 'no output'}") from None
    return versions


def mismatches(versions: dict[str, dict[str, str]]) -> list[str]:
    """One line per compared package whose version differs between hosts, naming the hosts."""
    lines = []
    for key in COMPARED:
        by_value: dict[str, list[str]] = {}
        for host, info in versions.items():
            by_value.setdefault(str(info.get(key, "not installed")), []).append(host)
        if len(by_value) > 1:
            lines.append(f"{key}: " + "; ".join(f"{value} on {', '.join(hosts)}" for value, hosts in by_value.items()))
    return lines


def format_table(versions: dict[str, dict[str, str]]) -> str:
    """Hosts as columns, packages as rows; a ``*`` marks a row that differs."""
    hosts = list(versions)
    keys = list(dict.fromkeys(k for info in versions.values() for k in info))
    width = max([len(k) for k in keys] + [4]) + 2
    cols = [max([len(h)] + [len(str(versions[h].get(k, "-"))) for k in keys]) + 2 for h in hosts]
    lines = ["  " + "host".ljust(width) + "".join(h.ljust(c) for h, c in zip(hosts, cols))]
    for key in keys:
        values = [str(versions[h].get(key, "-")) for h in hosts]
        mark = "*" if key in COMPARED and len(set(values)) > 1 else " "
        lines.append(f"{mark} " + key.ljust(width) + "".join(v.ljust(c) for v, c in zip(values, cols)))
    return "\n".join(line.rstrip() for line in lines)


def worker_identity() -> dict[str, str]:
    """What one rank tells the others at the start of a job: its host and versions."""
    from hvdtrain.tools.environment import versions

    return {"host": socket.gethostname(), **versions()}


def check_workers(identities: list[dict[str, Any]]) -> str:
    """From every rank's :func:`worker_identity` (indexed by rank): raise :class:`HostError` if
    versions differ between hosts, else return ``"h1 (ranks 0-1), h2 (ranks 2-3)"``."""
    by_host: dict[str, dict[str, str]] = {}
    ranks: dict[str, list[int]] = {}
    for rank, identity in enumerate(identities):
        host = identity["host"]
        by_host.setdefault(host, {k: v for k, v in identity.items() if k != "host"})
        ranks.setdefault(host, []).append(rank)
    wrong = mismatches(by_host)
    if wrong:
        raise HostError("the hosts of this job run different versions (install the same ones everywhere; "
                        "`hvdtrain env --hosts ...` compares them): " + " | ".join(wrong))
    return ", ".join(f"{host} (ranks {_ranges(r)})" for host, r in ranks.items())


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    parts, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(f"{start}-{rank}" if rank != start else f"{rank}")
            start = None
    return ",".join(parts)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def describe_workers(adapter: Any) -> str | None:
    """Gather every rank's host and versions (a collective: every rank calls it at the same point),
    raise :class:`HostError` on all ranks if versions differ between hosts, and return
    ``"hvdtrain: workers on h1 (ranks 0-1), h2 (ranks 2-3)"`` when the job spans several hosts."""
    identities = adapter.allgather_object(worker_identity())
    summary = check_workers(identities)
    return f"hvdtrain: workers on {summary}" if len({i["host"] for i in identities}) > 1 else None
