"""The Trainer as the entry points run it: the core's :class:`~hvdtrain.core.loop.Trainer` with the
default callbacks and checks wired in from the layers above the core.

* callbacks (:func:`default_callbacks`): the experiment trackers of ``log.trackers`` (TensorBoard
  by default; MLflow, W&B) and the progress bar, unless the config turns them off;
* checks (:class:`DefaultChecks`): the trackers reachable from rank 0 right after Horovod starts,
  and the same hvdtrain, Python, framework and Horovod versions on every host
  (:func:`hvdtrain.launch.hosts.describe_workers`).

``hvdtrain.Trainer``, ``hvdtrain.train``, ``hvdtrain recipe`` and :func:`hvdtrain.run`'s workers
run this one; the core imports none of it.
"""

from __future__ import annotations

from typing import Any

from hvdtrain.core import loop
from hvdtrain.core.callbacks import Callback
from hvdtrain.core.config import RunConfig
from hvdtrain.core.jobchecks import JobChecks
from hvdtrain.core.registry import get_recipe
from hvdtrain.launch.hosts import describe_workers
from hvdtrain.observability.progress import ProgressBar
from hvdtrain.observability.tensorboard_log import TensorBoardCallback
from hvdtrain.observability.trackers import REMOTE_TRACKERS, TrackersCallback, parse_trackers, preflight


def default_callbacks(config: Any) -> list[Callback]:
    """``log.trackers``: ``tensorboard`` -> :class:`TensorBoardCallback` (``train.tensorboard=false``,
    its older switch, still turns it off), ``mlflow``/``wandb`` -> one :class:`TrackersCallback`;
    ``train.progress_bar`` -> :class:`ProgressBar`."""
    callbacks: list[Callback] = []
    trackers = parse_trackers(config.log.trackers)
    if "tensorboard" in trackers and config.train.tensorboard:
        callbacks.append(TensorBoardCallback())
    if any(name in REMOTE_TRACKERS for name in trackers):
        callbacks.append(TrackersCallback(config))
    if config.train.progress_bar:
        callbacks.append(ProgressBar())
    return callbacks


class DefaultChecks(JobChecks):
    """The trackers' preflight and the hosts' versions (see the module docstring)."""

    def started(self, config: Any, adapter: Any, ctx: Any) -> None:
        """Rank 0 reaches the trackers of ``log.trackers`` (MLflow's server, W&B's login) and all
        ranks raise the same one-line :class:`~hvdtrain.observability.trackers.TrackerError` if
        one cannot be used (a collective unless elastic)."""
        preflight(config, adapter, ctx)

    def workers(self, adapter: Any) -> str | None:
        """Every rank's host and versions gathered; a :class:`~hvdtrain.launch.hosts.HostError` on
        every rank if they differ between hosts, the hosts' line when the job spans several."""
        return describe_workers(adapter)


class Trainer(loop.Trainer):
    """Runs one recipe on one framework with the given config: :func:`default_callbacks` before the
    caller's ``callbacks``, and :class:`DefaultChecks` unless ``checks`` are given."""

    def __init__(self, config: RunConfig, adapter: Any = None, callbacks: list[Callback] | tuple[Callback, ...] = (),
                 checks: JobChecks | None = None):
        super().__init__(config, adapter, [*default_callbacks(config), *callbacks], checks or DefaultChecks())


def train(config: RunConfig, callbacks: list[Callback] | tuple[Callback, ...] = ()) -> loop.RunResult:
    """Run ``config`` in this process (under horovodrun/mpirun, every worker calls this)."""
    get_recipe(config.recipe)
    return Trainer(config, callbacks=callbacks).fit()
