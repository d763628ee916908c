"""Weights & Biases, through the ``wandb`` client, online or offline (``WANDB_MODE``).

Step metrics are ``step/loss``, ``step/lr``, ``step/samples_per_sec`` against ``global_step``;
epoch metrics keep their ``metrics.jsonl`` names against ``epoch`` (``define_metric``), so the two
x axes never fight over W&B's own step counter, and a resumed run (``resume="allow"`` with the id
from trackers.json) may log again from where it left off. Offline runs land in
``<output>/wandb/offline-run-*`` (``wandb sync`` uploads them); their ``.wandb`` files hold the
records; a resumed run reads them to know which epochs W&B really got (:mod:`.wandb_files`).
"""

from __future__ import annotations

from typing import Any

from pathlib import Path

from hvdtrain.observability.trackers.base import Tracker

FLUSH_INTERVAL_SEC = 1.0  # how often W&B writes its run file (its default, 15 s, loses more to a kill)


class WandbTracker(Tracker):
    """A run in ``log.wandb_project`` (and ``log.wandb_entity``); its files under ``<output>/wandb``."""

    name = "wandb"

    def __init__(self, config: Any, output: str):
        self.project, self.entity, self.dir = config.log.wandb_project, config.log.wandb_entity, output
        self.run: Any = None

    def open(self, run_id: str | None, run_name: str, params: dict[str, str], tags: dict[str, str]) -> str:
        import wandb

        from hvdtrain.observability.trackers.preflight import wandb_mode

        # the mode as WANDB_MODE says now (W&B's process-wide settings may hold an older one)
        self.run = wandb.init(project=self.project, entity=self.entity, dir=self.dir, id=run_id, name=run_name,
                              mode=wandb_mode(),
                              resume="allow" if run_id else None, config=params, allow_val_change=True,
                              reinit="create_new",
                              settings=wandb.Settings(console="off", x_disable_stats=True, silent=True,
                                                      save_code=False, disable_git=True,
                                                      x_transaction_log_flush_interval=FLUSH_INTERVAL_SEC))
        self.run.define_metric("global_step", hidden=True)
        self.run.define_metric("step/*", step_metric="global_step")
        self.run.define_metric("epoch", hidden=True)
        for key in ("train_loss", "val_*", "samples_per_sec", "epoch_time_sec", "lr", "skipped_updates"):
            self.run.define_metric(key, step_metric="epoch")
        self.set_tags(tags)
        return self.run.id

    def logged(self) -> tuple[set[int], int]:
        from hvdtrain.observability.trackers.wandb_files import logged

        # the earlier pieces' files (this piece's own file is still being written)
        return logged(Path(self.run.settings.wandb_dir), self.run.id)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.run.config.update(tags, allow_val_change=True)
        self.run.tags = tuple(sorted({*self.run.tags, f"framework:{tags.get('hvdtrain.framework')}"}))

    def log_metrics(self, metrics: dict[str, float], step: int, kind: str) -> None:
        if kind == "step":
            self.run.log({"global_step": int(step), **{f"step/{k}": v for k, v in metrics.items()}})
        else:
            self.run.log({**metrics, "epoch": int(step)})

    def log_artifact(self, path: str, name: str) -> None:
        import wandb

        artifact = wandb.Artifact(name.replace("/", "-"), type="checkpoint")
        artifact.add_dir(path)
        self.run.log_artifact(artifact)

    def close(self, finished: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if finished else None)
            self.run = None
