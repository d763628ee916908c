"""How this process was started, and what Horovod needs to run: the adapters' one call around
``hvd.init()`` (:func:`start`).

Under ``horovodrun`` (Gloo or MPI) or ``mpirun`` the launcher sets rank variables and Horovod
picks its controller itself. A task of a Slurm step (``srun hvdtrain ...``) has only Slurm's:
:mod:`hvdtrain.launch.slurm` forms the Gloo job from them (task 0 runs the rendezvous); a worker
of ``torchrun`` has only torch's (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...):
:mod:`hvdtrain.launch.torchrun` forms the Gloo job the same way (:mod:`hvdtrain.launch.gloo`). A process
started alone has none; Horovod built with MPI would then try an MPI singleton start, which a
relocated Open MPI (such as PyPI's) cannot do. A lone process therefore runs on Horovod's Gloo
controller, which needs no rendezvous for one rank.

The config's ``comm`` section (fusion threshold, cycle time, autotune, timeline) becomes the
``HOROVOD_*`` variables Horovod reads at ``hvd.init()``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hvdtrain.core.comm import horovod_comm_variables
from hvdtrain.core.config import preempt_signal_names
from hvdtrain.core.gpipe import enable_process_sets
from hvdtrain.launch import slurm, torchrun
from hvdtrain.launch.detect import under_launcher
from hvdtrain.launch.hosts import check_gloo_hostname


def prepare_horovod_environment(config: Any = None) -> dict[str, str]:
    """Call before ``hvd.init()`` (Horovod reads these variables only then).

    A task of a Slurm step becomes a Gloo worker of the step's job
    (:func:`hvdtrain.launch.slurm.prepare_slurm_step`); a process that Slurm's batch script started
    by itself in a job of several tasks is refused (:func:`hvdtrain.launch.slurm.check_batch_process`);
    a worker of a torchrun job becomes a Gloo worker of that job
    (:func:`hvdtrain.launch.torchrun.prepare_torchrun_job`; a variable missing or at odds is named);
    in a Slurm job, a warning signal (``--signal=USR1@...``) that comes while the training loop does
    not watch for it is ignored (:func:`hvdtrain.launch.slurm.ignore_early_and_late_warnings`).
    A process started alone uses Gloo as a single rank. With a
    :class:`~hvdtrain.core.config.RunConfig`, its ``comm`` section is exported as Horovod's
    variables (the timeline's and autotune log's folders are created). Returns what was set.
    """
    checkpoint = getattr(config, "checkpoint", None)
    slurm.ignore_early_and_late_warnings(preempt_signal_names(getattr(checkpoint, "preempt_signals", "USR1,TERM")))
    step = slurm.slurm_step()
    if step is not None:
        slurm.prepare_slurm_step(step)  # task 0 serves the rendezvous, the others wait for it
    slurm.check_batch_process()
    job = torchrun.torchrun_job()
    if job is not None:
        torchrun.prepare_torchrun_job(job)  # rank 0 serves the rendezvous on MASTER_ADDR, the others join
    check_gloo_hostname()  # a Gloo job across hosts needs each host's name to resolve off loopback
    if not under_launcher() or slurm.lone_slurm_process() or torchrun.lone_torchrun_process():
        os.environ.setdefault("HOROVOD_CONTROLLER", "gloo")
        os.environ.setdefault("HOROVOD_CPU_OPERATIONS", "gloo")
    env = horovod_comm_variables(config.comm) if config is not None and hasattr(config, "comm") else {}
    for name in ("HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE_LOG"):
        if name in env:
            Path(env[name]).parent.mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    return env


def start(hvd: Any, config: Any) -> None:
    """Start Horovod in this process: the launcher's environment prepared
    (:func:`prepare_horovod_environment`), pipeline stages' process sets enabled, ``hvd.init()``
    (``hvd``: the framework's Horovod module), then the world Slurm promised checked (several
    tasks each in a world of 1 are named, not trained:
    :func:`hvdtrain.launch.slurm.check_world_size`)."""
    prepare_horovod_environment(config)  # comm options become HOROVOD_* variables before init
    enable_process_sets(config)  # pipeline stages: their process sets are added after init
    hvd.init()
    slurm.check_world_size(hvd.size())
