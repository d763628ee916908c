"""MLflow, through its own client (``mlflow-skinny`` is enough): one run in ``log.mlflow_experiment``.

Step metrics go through MLflow's asynchronous ``log_batch`` (a background thread of MLflow's sends
them), so a slow server never holds a training step; an epoch's metrics are sent at once (one
request per epoch), so an epoch counted as logged is on the server. A resumed run asks the server
which epochs and steps it already holds (:meth:`MlflowTracker.logged`). On a resume the
params already in the run are kept (MLflow's params cannot change): a changed value is recorded as
the tag ``hvdtrain.resumed.<key>``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from hvdtrain.observability.trackers.base import Tracker
from hvdtrain.observability.trackers.preflight import mlflow_uri

BATCH = 100  # MLflow's log_batch takes at most 100 params, 1000 metrics per call
MAX_PENDING = 256  # queued step-metric sends before a step waits for the oldest


class MlflowTracker(Tracker):
    """A run on the MLflow tracking server (or store) of ``log.mlflow_tracking_uri``."""

    name = "mlflow"

    def __init__(self, config: Any):
        from mlflow import MlflowClient

        self.uri = mlflow_uri(config)
        self.client = MlflowClient(self.uri)
        self.experiment = config.log.mlflow_experiment
        self.run_id: str | None = None
        self.pending: deque[Any] = deque()  # RunOperations of asynchronous log_batch calls, oldest first

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(self.experiment)
        except Exception:  # another job created it meanwhile
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def open(self, run_id: str | None, run_name: str, params: dict[str, str], tags: dict[str, str]) -> str:
        from mlflow.entities import Param, RunTag

        logged: dict[str, str] = {}
        if run_id is not None:
            run = self.client.get_run(run_id)
            logged = dict(run.data.params)
            self.client.update_run(run_id, status="RUNNING")
        else:
            run_id = self.client.create_run(self._experiment_id(), run_name=run_name).info.run_id
        self.run_id = run_id
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        changed = {f"hvdtrain.resumed.{k}": v for k, v in params.items() if k in logged and logged[k] != v}
        for i in range(0, len(new), BATCH):
            self.client.log_batch(run_id, params=new[i:i + BATCH])
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in {**tags, **changed}.items()])
        return run_id

    def logged(self) -> tuple[set[int], int]:
        epochs = {int(m.step) for m in self.client.get_metric_history(self.run_id, "train_loss")}
        steps = [int(m.step) for m in self.client.get_metric_history(self.run_id, "step/loss")]
        return epochs, max(steps, default=-1)

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_metrics(self, metrics: dict[str, float], step: int, kind: str) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(f"{kind}/{k}" if kind == "step" else k, v, now, int(step)) for k, v in metrics.items()]
        if kind == "epoch":  # once per epoch: sent before the epoch counts as logged
            self._drain()
            self.client.log_batch(self.run_id, metrics=batch)
            return
        self.pending.append(self.client.log_batch(self.run_id, metrics=batch, synchronous=False))
        self._drain(done_only=True)

    def _drain(self, done_only: bool = False) -> None:
        """Wait for the queued sends (``done_only``: collect the oldest ones already sent, and wait
        only while more than ``MAX_PENDING`` are queued); raises what a background send raised."""
        while self.pending:
            oldest = self.pending[0]
            futures = getattr(oldest, "_operation_futures", None) or []
            if done_only and len(self.pending) <= MAX_PENDING and not all(f.done() for f in futures):
                return
            self.pending.popleft().wait()

    def log_artifact(self, path: str, name: str) -> None:
        self._drain()
        self.client.log_artifacts(self.run_id, path, artifact_path=name)

    def close(self, finished: bool) -> None:
        try:
            self._drain()
        finally:
            if finished and self.run_id is not None:
                self.client.set_terminated(self.run_id, "FINISHED")
