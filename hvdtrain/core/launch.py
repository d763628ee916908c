"""How this process was started, and what Horovod needs to run without a launcher.

Under ``horovodrun`` (Gloo or MPI) or ``mpirun`` the launcher sets rank variables and Horovod
picks its controller itself. A process started alone has none; Horovod built with MPI would then
try an MPI singleton start, which a relocated Open MPI (such as PyPI's) cannot do. A lone
process therefore runs on Horovod's Gloo controller, which needs no rendezvous for one rank.
"""

from __future__ import annotations

import os

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


def prepare_horovod_environment() -> None:
    """Call before ``hvd.init()``: a process started alone uses Gloo as a single rank."""
    if not under_launcher():
        os.environ.setdefault("HOROVOD_CONTROLLER", "gloo")
        os.environ.setdefault("HOROVOD_CPU_OPERATIONS", "gloo")
