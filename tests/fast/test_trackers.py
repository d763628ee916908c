"""Experiment trackers in-process (``log.trackers``): the toy recipe on the real Trainer logging to a
real MLflow tracking server on loopback (SQLite backend) and to the real W&B client offline, read
back through MLflow's client and W&B's run files. The 2-rank, both-framework, killed-and-resumed
jobs are in tests/integration/test_trackers.py."""

from __future__ import annotations

import importlib.util

import pytest
from toyrun import Interrupt, StopAt, fit

from envguard import isolate_environ

from hvdtrain.core.config import ConfigError
from hvdtrain.observability.trackers import TrackerError
from hvdtrain.observability.trackers.runfile import read_runs
from hvdtrain.observability.tensorboard_log import event_files

pytestmark = pytest.mark.trackers

mlflow = pytest.importorskip("mlflow")  # hvdtrain[trackers]: installed by scripts/install.sh
wandb = pytest.importorskip("wandb")
from trackers_support import free_port, mlflow_history, mlflow_server, wandb_runs  # noqa: E402

EPOCH_KEYS = ("train_loss", "val_loss", "val_accuracy", "samples_per_sec", "epoch_time_sec", "lr")


@pytest.fixture(autouse=True)
def tracker_environ(monkeypatch):
    """MLflow's client records its telemetry session in os.environ, W&B's login its service's
    address: given back after each test."""
    isolate_environ(monkeypatch, ["_MLFLOW_TELEMETRY_SESSION_ID", "WANDB_SERVICE"])
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    """One MLflow server for this module's tests."""
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    """W&B offline, its settings and cache in the test's folder."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name, folder in (("WANDB_CONFIG_DIR", "wandb-config"), ("WANDB_CACHE_DIR", "wandb-cache"),
                         ("WANDB_DATA_DIR", "wandb-data")):
        monkeypatch.setenv(name, str(tmp_path / folder))
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    wandb.teardown()  # what W&B's exit hook does when a process ends: unfinished runs are closed


def runs_named(client, experiment: str, name: str):
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id], f"attributes.run_name = '{name}'")


def test_one_run_across_an_interruption_and_a_resume(tmp_path, mlflow_uri, wandb_offline):
    """Interrupted in epoch 2 and resumed: one MLflow run and one W&B run, every epoch once, the step
    metrics at log_every, the config as params, versions as tags, the final checkpoint as an artifact."""
    from mlflow import MlflowClient

    out = tmp_path / "run"
    common = ("train.epochs=3", "checkpoint.every_steps=5", "train.log_every=4", "log.trackers=tensorboard,mlflow,wandb",
              f"log.mlflow_tracking_uri={mlflow_uri}", "log.mlflow_experiment=fast-resume", "log.log_checkpoint=final",
              "train.tensorboard=true")
    with pytest.raises(Interrupt):
        fit(out, *common, callbacks=[StopAt(16)])  # 12 steps per epoch: in epoch 2, after a checkpoint at step 15
    wandb.teardown()  # the interrupted "process" ends: W&B's exit hook closes its run
    first = read_runs(out)
    assert first["mlflow"]["epochs"] == 1 and first["wandb"]["epochs"] == 1
    resumed = fit(out, *common, "checkpoint.resume=true")
    assert read_runs(out)["mlflow"]["run_id"] == first["mlflow"]["run_id"]
    assert read_runs(out)["wandb"]["run_id"] == first["wandb"]["run_id"]
    assert event_files(out), "tensorboard stays on beside the others"

    client = MlflowClient(mlflow_uri)
    runs = runs_named(client, "fast-resume", "run")
    assert [r.info.run_id for r in runs] == [first["mlflow"]["run_id"]]
    run = runs[0]
    assert run.info.status == "FINISHED"
    for key in EPOCH_KEYS:
        history = mlflow_history(client, run.info.run_id, key)
        assert [step for step, _ in history] == [1, 2, 3], key
        assert [v for _, v in history] == pytest.approx([r[key] for r in resumed.metrics()]), key
    steps = [s for s, _ in mlflow_history(client, run.info.run_id, "step/loss")]
    assert steps[:3] == [4, 8, 12] and steps[-1] == 36 and steps == sorted(set(steps))  # the progress lines' steps
    assert run.data.params["train.epochs"] == "3" and run.data.params["log.trackers"] == "tensorboard,mlflow,wandb"
    assert run.data.tags["hvdtrain.framework"] == "torch" and run.data.tags["hvdtrain.world_size"] == "1"
    assert run.data.tags["hvdtrain.version"]
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoint-final")]
    assert "checkpoint-final/manifest.json" in artifacts

    (wb,) = wandb_runs(out / "wandb").values()
    assert len(wb["files"]) == 2  # the first piece and the resumed one, same id
    epochs = [row["epoch"] for row in wb["history"] if "train_loss" in row]
    assert epochs == [1, 2, 3]
    assert [row["val_loss"] for row in wb["history"] if "val_loss" in row] == pytest.approx(
        [r["val_loss"] for r in resumed.metrics()])
    steps = [row["global_step"] for row in wb["history"] if "step/loss" in row]
    assert steps == sorted(set(steps)) and steps[-1] == 36
    assert wb["config"]["train.epochs"] == "3" and wb["config"]["hvdtrain.framework"] == "torch"


def test_epochs_a_run_lacks_are_caught_up_on_resume(tmp_path, mlflow_uri):
    """The tracker's run lacks an epoch metrics.jsonl has (a process killed before it was sent): the
    resume asks the server what the run holds and logs the missing epoch first, the new ones after."""
    from mlflow import MlflowClient

    from hvdtrain.observability.trackers.runfile import write_runs

    out, client = tmp_path / "catchup", MlflowClient(mlflow_uri)
    common = ("log.trackers=mlflow", f"log.mlflow_tracking_uri={mlflow_uri}", "log.mlflow_experiment=fast-catchup")
    fit(out, *common, "train.epochs=1")
    experiment = client.get_experiment_by_name("fast-catchup").experiment_id
    empty = client.create_run(experiment, run_name="catchup").info.run_id  # holds nothing yet
    client.delete_run(read_runs(out)["mlflow"]["run_id"])
    write_runs(out, {"mlflow": {"run_id": empty}})
    resumed = fit(out, *common, "train.epochs=2", "checkpoint.resume=true")
    history = mlflow_history(client, empty, "train_loss")
    assert [s for s, _ in history] == [1, 2]
    assert [v for _, v in history] == pytest.approx([r["train_loss"] for r in resumed.metrics()])
    assert [r.info.run_id for r in runs_named(client, "fast-catchup", "catchup")] == [empty]


def test_an_unreachable_mlflow_server_stops_the_run_before_training(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TrackerError, match=rf"log.trackers=mlflow: cannot reach the MLflow tracking server at {uri}"):
        fit(tmp_path / "down", "log.trackers=mlflow", f"log.mlflow_tracking_uri={uri}")
    assert not (tmp_path / "down" / "metrics.jsonl").exists()
    assert not (tmp_path / "down" / "trackers.json").exists()


def test_a_url_that_is_not_an_mlflow_server_is_refused(tmp_path, mlflow_uri):
    with pytest.raises(TrackerError, match="does not answer as an MLflow tracking server"):
        fit(tmp_path / "wrong", "log.trackers=mlflow", f"log.mlflow_tracking_uri={mlflow_uri}/no/such/prefix")


def test_the_tracking_uri_comes_from_mlflow_tracking_uri(tmp_path, mlflow_uri, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    fit(tmp_path / "env", "log.trackers=mlflow", "log.mlflow_experiment=fast-env", "log.run_name=from-env",
        "log.log_checkpoint=best", "checkpoint.best_metric=val_loss", "checkpoint.best_mode=min")
    (run,) = runs_named(MlflowClient(mlflow_uri), "fast-env", "from-env")
    assert [a.path for a in MlflowClient(mlflow_uri).list_artifacts(run.info.run_id)] == ["checkpoint-best"]


@pytest.mark.parametrize("login, says", [(None, "no W&B login for"), ("env", "cannot log in to W&B at"),
                                         ("netrc", "cannot log in to W&B at")])
def test_wandb_online_without_a_login_or_a_server_stops_the_run_before_training(tmp_path, monkeypatch, login, says):
    """No key at all; or a key (from WANDB_API_KEY, or the netrc entry `wandb login` writes for the
    host) but nothing answers at WANDB_BASE_URL. The check is one HTTP request: it starts no W&B
    service process, so nothing is left running to hold the process's exit."""
    port = free_port()
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    if login == "env":
        monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    elif login == "netrc":
        (tmp_path / "netrc").write_text(f"machine 127.0.0.1\n  login user\n  password {'b' * 40}\n")
        (tmp_path / "netrc").chmod(0o600)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(TrackerError, match=rf"log.trackers=wandb: {says} http://127.0.0.1:{port}.*WANDB_MODE=offline"):
        fit(tmp_path / "nologin", "log.trackers=wandb")
    assert not (tmp_path / "nologin" / "metrics.jsonl").exists()


def test_a_tracker_whose_package_is_missing_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # what `import wandb` does when absent
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(TrackerError, match=r"the wandb client is not installed .*pip install 'hvdtrain\[trackers\]'"):
        fit(tmp_path / "missing", "log.trackers=wandb")


def test_log_trackers_is_the_switch_for_tensorboard(tmp_path):
    fit(tmp_path / "tb", "train.tensorboard=true")  # log.trackers defaults to tensorboard
    assert event_files(tmp_path / "tb")
    fit(tmp_path / "none", "train.tensorboard=true", "log.trackers=none")
    assert not event_files(tmp_path / "none")
    with pytest.raises(ConfigError, match=r"log.trackers: 'neptune' is not a tracker; choose from tensorboard"):
        fit(tmp_path / "bad", "log.trackers=tensorboard,neptune")  # when the config is read, before any worker


def test_an_elastic_reform_continues_the_same_run(tmp_path, mlflow_uri, wandb_offline):
    """``on_train_begin`` again with a new context (an elastic re-form): the process that stays rank 0
    keeps its runs (the world size tag follows); one that stops being rank 0 lets go; the process
    that becomes rank 0 reopens the same runs from trackers.json. Never a second run."""
    from mlflow import MlflowClient

    from hvdtrain.core.adapter import DistContext
    from hvdtrain.observability.trackers import TrackersCallback
    from toyrun import toy_config

    out = tmp_path / "elastic"
    out.mkdir()
    config = toy_config(out, "log.trackers=mlflow,wandb", f"log.mlflow_tracking_uri={mlflow_uri}",
                        "log.mlflow_experiment=fast-elastic", "train.elastic=true")

    def info(size, start_epoch):
        return {"config": config, "output": out, "start_epoch": start_epoch, "steps_per_epoch": 4, "world_size": size}

    first = TrackersCallback(config)
    first.on_train_begin(DistContext(rank=0, size=2), info(2, 0))
    first.on_epoch_end(0, {"epoch": 1, "train_loss": 0.5, "val_loss": 0.4, "step": 4})
    ids = read_runs(out)
    first.on_train_begin(DistContext(rank=0, size=3), info(3, 1))  # a worker joined; same rank 0
    first.on_epoch_end(1, {"epoch": 2, "train_loss": 0.3, "val_loss": 0.2, "step": 8})
    first.on_train_begin(DistContext(rank=1, size=2), info(2, 2))  # rank 0 is another process now
    assert first.trackers == {}
    second = TrackersCallback(config)
    second.on_train_begin(DistContext(rank=0, size=2), info(2, 2))
    second.on_epoch_end(1, {"epoch": 2, "train_loss": 0.3, "val_loss": 0.2, "step": 8})  # redone after a rollback
    second.on_epoch_end(2, {"epoch": 3, "train_loss": 0.2, "val_loss": 0.1, "step": 12})
    second.on_train_end(None)
    assert read_runs(out)["mlflow"]["run_id"] == ids["mlflow"]["run_id"]
    assert read_runs(out)["wandb"]["run_id"] == ids["wandb"]["run_id"]

    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("fast-elastic").experiment_id])
    assert [s for s, _ in mlflow_history(client, run.info.run_id, "train_loss")] == [1, 2, 3]
    assert run.data.tags["hvdtrain.world_size"] == "2" and run.info.status == "FINISHED"
    (wb,) = wandb_runs(out / "wandb").values()
    assert [row["epoch"] for row in wb["history"] if "train_loss" in row] == [1, 2, 3]


@pytest.mark.parametrize("uri, says", [
    ("ftp://nowhere", "cannot open the MLflow store ftp://nowhere (UnsupportedModelRegistryStoreURIException"),
    ("sqlite:///no-sqlalchemy.db", "is a database, which only the full mlflow package opens"),
])
def test_a_tracking_uri_of_the_wrong_kind_is_one_line_naming_the_fix(tmp_path, uri, says):
    if uri.startswith("sqlite") and importlib.util.find_spec("sqlalchemy") is not None:
        pytest.skip("the full mlflow package is in this venv: it opens SQLite stores")
    from hvdtrain.observability.trackers.preflight import verdict
    from toyrun import toy_config

    refusal = verdict(toy_config(tmp_path / "x", "log.trackers=mlflow", f"log.mlflow_tracking_uri={uri}"))
    assert refusal is not None and says in refusal and "\n" not in refusal and "scripts/mlflow-server.sh" in refusal
