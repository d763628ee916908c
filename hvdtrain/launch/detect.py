"""Which launcher started this process: the one place that asks "am I under a launcher?".

Each launcher leaves its own variables in its workers' environment: ``horovodrun --gloo`` its
rank and rendezvous, Open MPI (``mpirun``, ``horovodrun --mpi``), MPICH, Intel MPI and PMIx their
rank, ``torchrun`` (and anything that sets torch.distributed's ``env://`` variables) ``RANK`` and
``WORLD_SIZE``, Slurm's ``srun`` (and a batch script) ``SLURM_PROCID``. A launcher that sets up the
job itself wins over Slurm, whose variables are also seen by ``horovodrun``, ``mpirun`` or
``torchrun`` run inside an allocation (torchrun run by ``srun`` starts the workers itself). Asked
by the Horovod start-up (:mod:`hvdtrain.launch.start`: Gloo for a lone process), the Slurm step
(:mod:`hvdtrain.launch.slurm`), the torchrun job (:mod:`hvdtrain.launch.torchrun`), the progress
bar (no redraws into a launcher's forwarded output) and ``hvdtrain bench --np`` (which starts its
own launcher).
"""

from __future__ import annotations

import os
from typing import Mapping

# launcher -> the variables it sets in each worker, in the order they are asked
LAUNCHERS = (
    ("horovodrun", ("HOROVOD_RANK", "HOROVOD_GLOO_RENDEZVOUS_ADDR")),  # horovodrun --gloo
    ("mpi", ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")),  # Open MPI, MPICH / Intel MPI, PMIx
    ("torchrun", ("RANK", "WORLD_SIZE")),  # torchrun, or torch.distributed's env:// variables
    ("slurm", ("SLURM_PROCID",)),  # srun, or the batch script itself
)


def launcher(environ: Mapping[str, str] | None = None) -> str | None:
    """``"horovodrun"``, ``"mpi"``, ``"torchrun"`` or ``"slurm"``: the launcher that started this process (one
    that sets up the job itself before Slurm); None for a process started alone."""
    env = os.environ if environ is None else environ
    return next((name for name, variables in LAUNCHERS if any(v in env for v in variables)), None)


def under_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """True if a launcher (horovodrun, mpirun, torchrun, srun) started this process."""
    return launcher(environ) is not None


# the rank each launcher sets, from LAUNCHERS (not its rendezvous address)
RANK_VARIABLES = tuple(v for _, variables in LAUNCHERS for v in variables if v.endswith(("RANK", "PROCID")))


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This worker's rank as its launcher set it (in :data:`LAUNCHERS`' order), before Horovod
    starts; 0 for a process started alone or a value that is not a whole number."""
    env = os.environ if environ is None else environ
    value = next((env[v] for v in RANK_VARIABLES if v in env), "0")
    return int(value) if value.strip().isdigit() else 0

