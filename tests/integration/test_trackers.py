"""Experiment trackers in real 2-rank jobs (``horovodrun -np 2 --gloo``), both frameworks: rank 0 of a
job logging to a real MLflow tracking server (loopback, SQLite backend, served artifacts) and to W&B
offline at once is SIGKILLed mid-epoch, and ``--resume`` continues: exactly one MLflow run and one
W&B run, every epoch logged once, tags naming the framework, the world size and the versions, the
final checkpoint as an artifact. An unreachable server stops both ranks before training with one line.
The logic (catch-up, refusals, the TensorBoard switch) is in-process in tests/fast/test_trackers.py."""

from __future__ import annotations

import re

import pytest

from jobs import horovodrun, hvdtrain_cli, run_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.trackers]

mlflow = pytest.importorskip("mlflow")
wandb = pytest.importorskip("wandb")
from trackers_support import free_port, mlflow_history, mlflow_server, wandb_runs  # noqa: E402

# 128 samples / 2 ranks / batch 16 = 4 steps per epoch; a checkpoint every 2 steps; rank 0 killed
# before step 7 (in epoch 2, step-00000006 the latest checkpoint)
RUN = ["--epochs", "3", "--batch-size", "16", "--set", "data.max_train_samples=128", "--set", "data.max_val_samples=32",
       "--set", "train.log_every=2", "--set", "checkpoint.every_steps=2", "--set", "log.log_checkpoint=final",
       "--set", "log.trackers=tensorboard,mlflow,wandb"]
KILL_AT = 7


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def tracker_env(tmp_path, uri: str) -> dict[str, str]:
    return {"MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true", "WANDB_MODE": "offline",
            "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}


def command(framework, out, *extra):
    return [hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *RUN,
            "--set", f"log.mlflow_experiment=jobs-{framework}", *extra]


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_killed_and_resumed_job_is_one_run_with_every_epoch_once(tmp_path, framework, mlflow_uri):
    from mlflow import MlflowClient

    out, env = tmp_path / "run", tracker_env(tmp_path, mlflow_uri)
    # a job that does not come down after rank 0 was killed fails on the call's timeout (a hang bound)
    crash = horovodrun(command(framework, out), check=False, timeout=400,
                       env={**env, "HVDTRAIN_FAULT": f"kill:rank=0:step={KILL_AT}"})
    assert crash.returncode != 0
    assert [r["epoch"] for r in run_metrics(out)] == [1]
    resumed = horovodrun(command(framework, out, "--resume"), timeout=400, env=env)
    assert re.search(r"mlflow run \w+ continued \(epochs it holds: 1\)", resumed.stdout)
    # W&B's run file of the killed process holds what its service had flushed: epoch 1 or nothing
    assert re.search(r"wandb run \w+ continued \(epochs it holds: (1|none)\)", resumed.stdout)
    rows = run_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2, 3]

    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name(f"jobs-{framework}")
    (run,) = client.search_runs([experiment.experiment_id])  # one run for the job: not one per rank or per launch
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    for key in ("train_loss", "val_loss", "val_accuracy", "samples_per_sec", "lr"):
        history = mlflow_history(client, run.info.run_id, key)
        assert [s for s, _ in history] == [1, 2, 3], key
        assert [v for _, v in history] == pytest.approx([r[key] for r in rows]), key
    steps = [s for s, _ in mlflow_history(client, run.info.run_id, "step/loss")]
    assert steps[0] == 2 and steps[-1] == 12 and steps == sorted(set(steps)), steps
    tags = run.data.tags
    assert tags["hvdtrain.framework"] == framework and tags["hvdtrain.world_size"] == "2"
    assert tags["hvdtrain.framework_version"] and tags["hvdtrain.horovod_version"] == "0.28.1"
    assert run.data.params["train.epochs"] == "3" and run.data.params["data.max_train_samples"] == "128"
    assert "checkpoint-final/manifest.json" in [a.path for a in client.list_artifacts(run.info.run_id,
                                                                                      "checkpoint-final")]

    (wb,) = wandb_runs(out / "wandb").values()  # the killed piece and the resumed one: one run id
    assert len(wb["files"]) == 2
    assert [row["epoch"] for row in wb["history"] if "train_loss" in row] == [1, 2, 3]
    assert [row["val_loss"] for row in wb["history"] if "val_loss" in row] == pytest.approx(
        [r["val_loss"] for r in rows])
    assert wb["config"]["hvdtrain.framework"] == framework and wb["config"]["hvdtrain.world_size"] == "2"


def test_an_unreachable_server_stops_every_rank_before_training(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    # a rank left waiting on the others fails the call's timeout (a hang bound, not a timing)
    job = horovodrun([hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--output",
                      tmp_path / "down", *RUN], check=False, timeout=300,
                     env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_DISABLE_TELEMETRY": "true", "WANDB_MODE": "offline"})
    assert job.returncode != 0
    said = job.stdout + job.stderr
    assert f"log.trackers=mlflow: cannot reach the MLflow tracking server at {uri}" in said
    for rank in (0, 1):  # both ranks stop with the line (rank 1 with rank 0's verdict): none hangs
        assert any(line.startswith(f"[{rank}]") and "log.trackers=mlflow: cannot reach" in line
                   for line in said.splitlines()), rank
    assert "hvdtrain/core" not in said and "hvdtrain/observability" not in said  # one line, no traceback of ours
    assert not (tmp_path / "down" / "metrics.jsonl").exists()
