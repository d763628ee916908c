"""How this process was started, and what Horovod needs to run without a launcher.

Under ``horovodrun`` (Gloo or MPI) or ``mpirun`` the launcher sets rank variables and Horovod
picks its controller itself. A process started alone has none; Horovod built with MPI would then
try an MPI singleton start, which a relocated Open MPI (such as PyPI's) cannot do. A lone
process therefore runs on Horovod's Gloo controller, which needs no rendezvous for one rank.

The config's ``comm`` section (fusion threshold, cycle time, autotune, timeline) becomes the
``HOROVOD_*`` variables Horovod reads at ``hvd.init()``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

LAUNCHER_VARIABLES = (
    "HOROVOD_RANK",  # horovodrun --gloo
    "HOROVOD_GLOO_RENDEZVOUS_ADDR",
    "OMPI_COMM_WORLD_RANK",  # Open MPI (horovodrun --mpi, mpirun)
    "PMI_RANK",  # MPICH / Intel MPI
    "PMIX_RANK",
    "SLURM_PROCID",
)


def under_launcher(environ: dict[str, str] | None = None) -> bool:
    """True if a launcher (horovodrun, mpirun, srun) started this process."""
    env = os.environ if environ is None else environ
    return any(name in env for name in LAUNCHER_VARIABLES)


def horovod_comm_variables(comm: Any) -> dict[str, str]:
    """The Horovod environment variables a :class:`~hvdtrain.core.config.CommConfig` sets.

    Options left at None/false are absent, so what ``horovodrun`` (``--fusion-threshold-mb``,
    ``--timeline-filename``, ``--autotune``, ...) or the user exported stays in force.
    """
    env: dict[str, str] = {}
    if comm.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(round(comm.fusion_threshold_mb * 1024 * 1024)))
    if comm.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{comm.cycle_time_ms:g}"
    if comm.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if comm.autotune_log:
        env["HOROVOD_AUTOTUNE_LOG"] = str(Path(comm.autotune_log).expanduser().absolute())
    if comm.timeline:
        env["HOROVOD_TIMELINE"] = str(Path(comm.timeline).expanduser().absolute())
    if comm.timeline_mark_cycles:
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    return env


def prepare_horovod_environment(config: Any = None) -> dict[str, str]:
    """Call before ``hvd.init()`` (Horovod reads these variables only then).

    A process started alone uses Gloo as a single rank. With a
    :class:`~hvdtrain.core.config.RunConfig`, its ``comm`` section is exported as Horovod's
    variables (the timeline's and autotune log's folders are created). Returns what was set.
    """
    if not under_launcher():
        os.environ.setdefault("HOROVOD_CONTROLLER", "gloo")
        os.environ.setdefault("HOROVOD_CPU_OPERATIONS", "gloo")
    env = horovod_comm_variables(config.comm) if config is not None and hasattr(config, "comm") else {}
    for name in ("HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE_LOG"):
        if name in env:
            Path(env[name]).parent.mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    return env


def reduction_problem(comm: Any, size: int, mpi_enabled: bool) -> str | None:
    """Why ``comm.reduction`` cannot run in this job (None if it can). Horovod 0.28 implements
    Adasum on CPU only over MPI, and only for a power-of-2 number of workers."""
    if comm.reduction != "adasum" or size == 1:
        return None
    if not mpi_enabled:
        return ("comm.reduction: 'adasum' needs Horovod's MPI controller (horovodrun --mpi or mpirun); this job "
                "runs on Gloo. Use comm.reduction=average or launch with MPI")
    if size & (size - 1):
        return f"comm.reduction: 'adasum' needs a power-of-2 number of workers, this job has {size}"
    return None
