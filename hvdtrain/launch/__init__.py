"""How a job is launched: everything between "a process started" and "Horovod runs".

* :mod:`~hvdtrain.launch.detect`: which launcher started this process (the one place that asks);
* :mod:`~hvdtrain.launch.start`: :func:`start` is the adapters' one call around ``hvd.init()``
  (Slurm step, the singleton trap, Gloo host names, the ``comm`` section as ``HOROVOD_*``
  variables, the world size Slurm promised);
* :mod:`~hvdtrain.launch.slurm`: a Slurm step formed into a Gloo job, ``hvdtrain slurm-hosts``;
* :mod:`~hvdtrain.launch.torchrun`: a ``torchrun`` job formed into a Gloo job the same way;
* :mod:`~hvdtrain.launch.gloo`: the rendezvous both use (rank 0 serves Horovod's, the others join);
* :mod:`~hvdtrain.launch.hosts`: ``-H`` host lists, SSH reachability, the same versions on every
  host (before a job, and every rank's identity once it runs);
* :mod:`~hvdtrain.launch.jobchannel`: :func:`hvdtrain.run`'s signed channel to its workers.

It sits on the core (which never imports it) and is used by the entry points and the framework
adapters. Importing it loads no framework and no Horovod.
"""

from hvdtrain.launch.detect import launcher, under_launcher
from hvdtrain.launch.start import prepare_horovod_environment, start

__all__ = ["launcher", "prepare_horovod_environment", "start", "under_launcher"]
