"""A ``torchrun`` job (``torchrun --nproc_per_node=N script.py``, or any launcher that sets
torch.distributed's ``env://`` variables) formed into one Horovod job over Gloo.

torchrun starts every worker with its place in the job: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node's place) and ``MASTER_ADDR``/``MASTER_PORT`` (the
host of the node of rank 0, and the port of torch's own store there). Horovod knows none of them:
without this, each worker would start Horovod alone, as a world of 1, and train over all the
data. :func:`torchrun_job` reads them into a :class:`~hvdtrain.launch.gloo.GlooJob`, and
:func:`hvdtrain.launch.gloo.join` forms the job as it does for a Slurm step: rank 0 serves
Horovod's rendezvous on ``MASTER_ADDR``, the others join it.

The rendezvous port is ``MASTER_PORT + 1`` (``MASTER_PORT`` itself is torch's store, held by
torchrun's agent; ``MASTER_PORT - 1`` when that is 65535), so every worker computes the same one
without talking; ``HVDTRAIN_TORCHRUN_RENDEZVOUS_PORT`` overrides it. Rank 0 stores the job's
tag (``TORCHELASTIC_RUN_ID`` and ``TORCHELASTIC_RESTART_COUNT``) on its server and the others
check it: a server of another job on the port is named, never joined.

The job is recognised by ``WORLD_SIZE`` or ``RANK`` set when no launcher of its own
(``horovodrun``, ``mpirun``) set up the job; it comes before Slurm, as torchrun run by ``srun``
(one torchrun per node) starts the workers itself. A variable that is missing or does not fit the
others is named in one line, before anything starts. A job of one worker is a lone process.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Mapping

from hvdtrain.core.errors import TrainingError
from hvdtrain.launch import gloo

PORT_VARIABLE = "HVDTRAIN_TORCHRUN_RENDEZVOUS_PORT"
TIMEOUT_VARIABLE = "HVDTRAIN_TORCHRUN_RENDEZVOUS_TIMEOUT"  # seconds a worker waits for rank 0's server (default 300)
# what torch.distributed's env:// needs, and torchrun sets, beside RANK and WORLD_SIZE
REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MARKERS = ("WORLD_SIZE", "RANK")  # what says "torchrun (or env://) started this process"


class TorchrunError(TrainingError):
    """A torchrun job cannot become a Horovod job; the message says which variable and why."""


@dataclass(frozen=True)
class TorchrunJob(gloo.GlooJob):
    """One worker of a torchrun job, and the job's layout (a :class:`~hvdtrain.launch.gloo.GlooJob`)."""

    rank: int
    size: int
    local_rank: int
    node: str  # this worker's node (its host name; torchrun does not name the others)
    master_addr: str
    master_port: int
    run_id: str = "none"
    restart: int = 0
    nodes: list[str] = field(default_factory=list)
    tasks_per_node: list[int] = field(default_factory=list)
    port_override: int | None = None
    kind = "torchrun job"
    member = "rank"
    port_variable = PORT_VARIABLE
    timeout_variable = TIMEOUT_VARIABLE
    where = "before torchrun on every node"
    error = TorchrunError

    @property
    def rendezvous_host(self) -> str:
        """``MASTER_ADDR``: the node of rank 0."""
        return self.master_addr

    @property
    def port(self) -> int:
        """``HVDTRAIN_TORCHRUN_RENDEZVOUS_PORT``, else the port beside ``MASTER_PORT``."""
        if self.port_override is not None:
            return self.port_override
        return self.master_port + 1 if self.master_port < 65535 else self.master_port - 1

    @property
    def tag(self) -> str:
        """``RUN_ID.RESTART``: a restarted job (``--max-restarts``) is another rendezvous."""
        return f"{self.run_id}.{self.restart}"


def _number(env: Mapping[str, str], name: str, low: int = 0) -> int:
    value = env.get(name, "")
    if not value.strip().isdigit() or int(value) < low:
        raise TorchrunError(f"torchrun variable {name}={value[:40]!r} is not a whole number >= {low} (this process "
                            f"was started by torchrun or with torch.distributed's env:// variables: "
                            f"{', '.join(n for n in MARKERS if n in env)} set)")
    return int(value)


def started_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """True where torchrun's (torch.distributed's ``env://``) variables say this process is a
    worker of a job: ``WORLD_SIZE`` or ``RANK`` set."""
    env = os.environ if environ is None else environ
    return any(name in env for name in MARKERS)


def torchrun_job(environ: Mapping[str, str] | None = None) -> TorchrunJob | None:
    """This worker's :class:`TorchrunJob` when torchrun started it (and ``horovodrun`` or
    ``mpirun`` did not: :func:`hvdtrain.launch.detect.launcher`); None otherwise, and for a job of
    one worker. A missing or inconsistent variable is a :class:`TorchrunError` naming it."""
    from hvdtrain.launch.detect import launcher

    env = os.environ if environ is None else environ
    if launcher(env) != "torchrun":
        return None
    size = _number(env, "WORLD_SIZE", 1) if "WORLD_SIZE" in env else None
    if size == 1 and env.get("RANK", "0") == "0":
        return None  # one worker: a lone process
    missing = next((name for name in REQUIRED if not env.get(name, "").strip()), None)
    if missing is not None:
        have = ", ".join(f"{n}={env[n]}" for n in REQUIRED if env.get(n, "").strip())
        raise TorchrunError(f"torchrun's environment without {missing} ({have} set): hvdtrain forms the Horovod job "
                            f"from {', '.join(REQUIRED)}; start the script with `torchrun --nproc_per_node=N "
                            f"script.py`, or set every one of them")
    size = _number(env, "WORLD_SIZE", 1)
    rank, local_rank = _number(env, "RANK"), _number(env, "LOCAL_RANK")
    local_size, master_port = _number(env, "LOCAL_WORLD_SIZE", 1), _number(env, "MASTER_PORT", 1)
    if rank >= size:
        raise TorchrunError(f"torchrun variables: RANK={rank} does not fit WORLD_SIZE={size}")
    if local_rank >= local_size:
        raise TorchrunError(f"torchrun variables: LOCAL_RANK={local_rank} does not fit LOCAL_WORLD_SIZE={local_size}")
    if size % local_size:
        raise TorchrunError(f"torchrun variables: WORLD_SIZE={size} is not a whole number of nodes of "
                            f"LOCAL_WORLD_SIZE={local_size} workers")
    count = size // local_size
    group = _number(env, "GROUP_RANK") if env.get("GROUP_RANK", "").strip() else rank // local_size
    if group >= count or rank != group * local_size + local_rank:
        raise TorchrunError(f"torchrun variables: RANK={rank} is not node GROUP_RANK={group}'s worker "
                            f"LOCAL_RANK={local_rank} of LOCAL_WORLD_SIZE={local_size} (hvdtrain needs the ranks of a "
                            f"node together, as torchrun gives them)")
    if master_port > 65535:
        raise TorchrunError(f"torchrun variable MASTER_PORT={master_port} is not a port number")
    override = None
    if env.get(PORT_VARIABLE):
        value = env[PORT_VARIABLE]
        if not value.isdigit() or not 1024 <= int(value) <= 65535:
            raise TorchrunError(f"{PORT_VARIABLE}={value[:40]!r} is not a port number in 1024-65535")
        override = int(value)
    node = socket.gethostname()
    nodes = [node if index == group else f"torchrun-node-{index}" for index in range(count)]  # only ours is known
    return TorchrunJob(rank=rank, size=size, local_rank=local_rank, node=node, master_addr=env["MASTER_ADDR"].strip(),
                       master_port=master_port, run_id=env.get("TORCHELASTIC_RUN_ID") or "none",
                       restart=int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
                       if env.get("TORCHELASTIC_RESTART_COUNT", "0").strip().isdigit() else 0,
                       nodes=nodes, tasks_per_node=[local_size] * count, port_override=override)


def lone_torchrun_process(environ: Mapping[str, str] | None = None) -> bool:
    """A worker of a one-worker torchrun job (``WORLD_SIZE=1``): it runs as one rank on Gloo, like
    a process started alone."""
    from hvdtrain.launch.detect import launcher

    env = os.environ if environ is None else environ
    return launcher(env) == "torchrun" and env.get("WORLD_SIZE", "").strip() == "1"


def prepare_torchrun_job(job: TorchrunJob, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Turn this worker of ``job`` into a Horovod Gloo worker (:func:`hvdtrain.launch.gloo.join`):
    rank 0 serves the rendezvous on ``MASTER_ADDR``, the others wait for it. Returns the variables set."""
    return gloo.join(job, environ)
