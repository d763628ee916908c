"""Experiment trackers behind one key, ``log.trackers`` (``tensorboard``, ``mlflow``, ``wandb``).

Rank 0 alone writes them: one tracker run per job whatever the world size. The run's ids are kept
in ``<output>/trackers.json`` (:mod:`.runfile`), so ``--resume`` and an elastic re-form continue
the same run, and an epoch already logged is not logged again. :func:`preflight` (every rank, before
the model is built) has rank 0 reach each tracker and shares its verdict, so an unreachable server
or a missing package stops every rank with one line before training. :class:`TrackersCallback`
logs the resolved config (params), the ``train.log_every`` step metrics, every number of each
``metrics.jsonl`` line, versions as tags, and ``log.log_checkpoint`` as an artifact.

The tracker packages (``mlflow-skinny``, ``wandb``) are imported only when ``log.trackers`` names them.
"""

from __future__ import annotations

from hvdtrain.observability.trackers.base import REMOTE_TRACKERS, TRACKERS, TrackerError, parse_trackers
from hvdtrain.observability.trackers.callback import TrackersCallback
from hvdtrain.observability.trackers.preflight import preflight

__all__ = ["REMOTE_TRACKERS", "TRACKERS", "TrackerError", "TrackersCallback", "parse_trackers", "preflight"]
