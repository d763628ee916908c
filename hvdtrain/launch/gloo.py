"""A job whose launcher gave each process only its place (rank, size, rank on its node, the
nodes), formed into a Horovod job over Gloo: the one mechanism behind a Slurm step
(:mod:`hvdtrain.launch.slurm`) and a ``torchrun`` job (:mod:`hvdtrain.launch.torchrun`).

Each launcher's module reads its own variables into a layout (:class:`GlooJob`: rank, size,
local rank, this node, every node and the processes on each, the rendezvous host and port, a tag
that names the job). :func:`join` then does what ``horovodrun --gloo`` does for its workers:
rank 0 starts Horovod's own rendezvous server (``horovod.runner.http.http_server``, the one
``horovodrun`` runs) in a thread on the rendezvous host and stores the job's tag on it; every
other rank waits until that server answers with the same tag (a server of another job on the
port is named, never joined); then Horovod's variables are set (``HOROVOD_RANK``/``SIZE``/
``LOCAL_RANK``/``LOCAL_SIZE``/``CROSS_RANK``/``CROSS_SIZE``, ``HOROVOD_HOSTNAME``,
``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``, ``HOROVOD_CONTROLLER=gloo``,
``HOROVOD_CPU_OPERATIONS=gloo``, ``HOROVOD_GLOO_IFACE``, ``HOROVOD_GLOO_TIMEOUT_SECONDS``).
This module imports neither a framework nor Horovod (the server's classes are imported when
rank 0 starts it).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from typing import Any, ClassVar, Mapping

from hvdtrain.core.errors import TrainingError

SCOPE, KEY = "hvdtrain-slurm", "step"  # where rank 0's server says whose it is
DEFAULT_TIMEOUT = 300  # seconds a rank waits for rank 0's server, unless the launcher's variable says


class GlooJob:
    """The layout every launcher's job description provides (a dataclass of the launcher's
    module with ``rank``, ``size``, ``local_rank``, ``node``, ``nodes``, ``tasks_per_node``, and
    the properties ``port``, ``tag`` and ``rendezvous_host``), and the derived ranks Horovod needs.
    The class attributes name the job in messages and the variables that move its port and wait."""

    rank: int
    size: int
    local_rank: int
    node: str
    nodes: list[str]
    tasks_per_node: list[int]
    kind: ClassVar[str] = "job"  # "Slurm job": names the job (with its tag) in messages
    member: ClassVar[str] = "rank"  # "task": one process of the job
    port_variable: ClassVar[str] = ""
    timeout_variable: ClassVar[str] = ""
    where: ClassVar[str] = "in the job's environment"  # where the user sets the port variable
    error: ClassVar[type[TrainingError]] = TrainingError

    @property
    def node_index(self) -> int:
        """This node's place among the job's nodes."""
        return self.nodes.index(self.node)

    @property
    def local_size(self) -> int:
        """The processes on this node."""
        return self.tasks_per_node[self.node_index]

    @property
    def cross_size(self) -> int:
        """Nodes with a process of this local rank (Horovod's cross communicator)."""
        return sum(1 for n in self.tasks_per_node if n > self.local_rank)

    @property
    def cross_rank(self) -> int:
        """This node's place among the nodes with a process of this local rank."""
        return sum(1 for n in self.tasks_per_node[:self.node_index] if n > self.local_rank)

    @property
    def rendezvous_host(self) -> str:
        """The host where rank 0 serves the rendezvous (default: the first node)."""
        return self.nodes[0]

    @property
    def port(self) -> int:  # pragma: no cover - every launcher's layout defines it
        """Rank 0's rendezvous port."""
        raise NotImplementedError

    @property
    def tag(self) -> str:  # pragma: no cover - every launcher's layout defines it
        """What names this job on rank 0's server (checked by every other rank)."""
        raise NotImplementedError


def rendezvous_timeout(job: GlooJob | type[GlooJob], environ: Mapping[str, str] | None = None) -> float:
    """The job's timeout variable in seconds (default 300): a finite number in (0, 604800], else
    the job's error naming the variable."""
    env = os.environ if environ is None else environ
    text = env.get(job.timeout_variable) or str(DEFAULT_TIMEOUT)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= 7 * 24 * 3600:
        raise job.error(f"{job.timeout_variable}={text[:40]!r} is not a number of seconds in (0, 604800]")
    return value


def rendezvous_address(job: GlooJob) -> str:
    """The rendezvous host's address (its name resolved), else the job's error naming it."""
    try:
        return socket.gethostbyname(job.rendezvous_host)
    except OSError as e:
        raise job.error(f"{job.kind} {job.tag}: the rendezvous host {job.rendezvous_host} does not resolve ({e}); "
                        f"{job.member} 0's rendezvous runs there") from None


def network_interface(job: GlooJob, rendezvous_address: str) -> str | None:
    """The interface holding this node's address (its name's, else the one that routes to the
    rendezvous); None if it cannot be told (Gloo then picks one itself)."""
    import psutil  # Horovod's own dependency

    wanted = []
    try:
        wanted.append(socket.gethostbyname(job.node))
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((rendezvous_address, job.port))
            wanted.append(probe.getsockname()[0])
    except OSError:
        pass
    interfaces = psutil.net_if_addrs()
    for address in wanted:
        if address.startswith("127."):
            continue
        for name, addrs in interfaces.items():
            if any(a.family == socket.AF_INET and a.address == address for a in addrs):
                return name
    return None


def horovod_variables(job: GlooJob, rendezvous_address: str, iface: str | None) -> dict[str, str]:
    """What ``horovodrun --gloo`` gives a worker, from the job's layout."""
    env = {
        "HOROVOD_RANK": str(job.rank), "HOROVOD_SIZE": str(job.size),
        "HOROVOD_LOCAL_RANK": str(job.local_rank), "HOROVOD_LOCAL_SIZE": str(job.local_size),
        "HOROVOD_CROSS_RANK": str(job.cross_rank), "HOROVOD_CROSS_SIZE": str(job.cross_size),
        "HOROVOD_HOSTNAME": job.node,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_address, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(job.port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    return env


def host_alloc_plan(job: GlooJob) -> list:
    """Horovod's :class:`SlotInfo` for every process of the job (its server sizes its scopes from it)."""
    from horovod.runner.common.util.hosts import SlotInfo

    plan, rank = [], 0
    for index, (node, count) in enumerate(zip(job.nodes, job.tasks_per_node)):
        for local in range(count):
            cross = [n for n in job.tasks_per_node if n > local]
            plan.append(SlotInfo(hostname=node, rank=rank, local_rank=local,
                                 cross_rank=sum(1 for n in job.tasks_per_node[:index] if n > local),
                                 size=job.size, local_size=count, cross_size=len(cross)))
            rank += 1
    return plan


_SERVERS: list = []  # rank 0's rendezvous server, serving for the life of the process


def start_rendezvous(job: GlooJob) -> Any:
    """Rank 0: Horovod's rendezvous server on the job's port, holding the job's tag, serving in a
    thread for the life of the process; returned (``shutdown()`` stops it)."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    try:
        server = RendezvousHTTPServer(("", job.port), RendezvousHandler, False)
    except OSError as e:
        raise job.error(f"{job.kind} {job.tag}: cannot open the rendezvous port {job.port} on {job.node} ({e}); "
                        f"set {job.port_variable} to a free port for every {job.member} (e.g. `export "
                        f"{job.port_variable}=2{job.port % 10000:04d}` {job.where})") from None
    server.init(host_alloc_plan(job))
    server.cache.setdefault(SCOPE, {})[KEY] = job.tag.encode()
    threading.Thread(target=server.serve_forever, name="hvdtrain-rendezvous", daemon=True).start()
    _SERVERS.append(server)
    return server


def wait_rendezvous(job: GlooJob, address: str, environ: Mapping[str, str] | None = None) -> None:
    """Every rank but 0: until rank 0's server answers with this job's tag (a server of another
    job on the port is an error naming it; none within the timeout, one naming the host)."""
    import urllib.error  # here: only the ranks but 0 ask
    import urllib.request

    env = os.environ if environ is None else environ
    timeout = rendezvous_timeout(job, env)
    url = f"http://{address}:{job.port}/{SCOPE}/{KEY}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                tag = answer.read().decode()
            if tag == job.tag:
                return
            raise job.error(f"the rendezvous port {job.port} on {job.rendezvous_host} is held by {job.kind} {tag}, "
                            f"not {job.tag}: set {job.port_variable} to a free port for every {job.member}")
        except (OSError, urllib.error.URLError) as e:
            if time.monotonic() > deadline:
                raise job.error(f"{job.kind.split()[0]} {job.member} {job.rank}: {job.member} 0's rendezvous at "
                                f"{job.rendezvous_host}:{job.port} did not answer within {timeout:.0f} s ({e}); did "
                                f"{job.member} 0 start (its output says why not)? {job.timeout_variable} sets the "
                                f"wait") from None
            time.sleep(0.5)


def join(job: GlooJob, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Turn this process of ``job`` into a Horovod Gloo worker: rank 0 starts the rendezvous, the
    others wait for it; Horovod's variables are set in ``environ`` (default ``os.environ``;
    ``HOROVOD_GLOO_IFACE`` and ``HOROVOD_GLOO_TIMEOUT_SECONDS`` the user set are kept). Returns them."""
    env = os.environ if environ is None else environ
    timeout = rendezvous_timeout(job, env)  # a bad value is named before rank 0 serves or the others wait
    address = rendezvous_address(job)
    if job.rank == 0:
        start_rendezvous(job)
    else:
        wait_rendezvous(job, address, env)
    variables = horovod_variables(job, address, env.get("HOROVOD_GLOO_IFACE") or network_interface(job, address))
    # a launcher starts the processes of different nodes at different times (imports from a shared
    # file system can take minutes): Gloo's own wait for every rank (30 s by default) gets the
    # rendezvous timeout, unless the user set it
    variables["HOROVOD_GLOO_TIMEOUT_SECONDS"] = env.get("HOROVOD_GLOO_TIMEOUT_SECONDS") or str(int(timeout))
    env.update(variables)
    return variables
