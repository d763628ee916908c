"""Issue 41, item 4: credentials in URIs are never written or shown.

Before: ``log.mlflow_tracking_uri=http://user:password@host`` landed in ``config.yaml``, every
checkpoint's ``manifest.json``, the W&B run config, the MLflow run's params, stdout and the
one-line "cannot reach" error (the same from ``MLFLOW_TRACKING_URI``). Here the toy recipe trains
in-process (the real Trainer) with a secret in a tracking URI and in ``data.path``, logging to the
real W&B client offline; every file of the output folder (W&B's run files included) and
everything printed is searched for the secret. The trackers' parameters are one dict for MLflow
and W&B (``TrackerCallback``), so the W&B run's config shows what MLflow's params get.
"""

from __future__ import annotations

import pytest
from toyrun import fit

from envguard import isolate_environ

from hvdtrain.core.redact import redact_text, redact_uri

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize("uri, shown", [
    (f"http://alice:{SECRET}@mlflow.example:5000/x", "http://***@mlflow.example:5000/x"),
    (f"https://{SECRET}@host/shards/{{000..009}}.tar", "https://***@host/shards/{000..009}.tar"),
    (f"https://bucket.s3.amazonaws.com/a.tar?X-Amz-Credential=AK/{SECRET}&X-Amz-Signature={SECRET}",
     "https://bucket.s3.amazonaws.com/a.tar?X-Amz-Credential=***&X-Amz-Signature=***"),
    (f"http://host/train-{{0..3}}.tar?token={SECRET}#frag", "http://host/train-{0..3}.tar?token=***#frag"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("/data/imagenet", "/data/imagenet"),
    (f"sqlite:///{SECRET}.db", f"sqlite:///{SECRET}.db"),  # a path, not a secret
])
def test_redact_uri(uri, shown):
    assert redact_uri(uri) == shown
    assert redact_text(f"cannot reach {uri} (no answer); fix it") == f"cannot reach {shown} (no answer); fix it"


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    wandb = pytest.importorskip("wandb")
    isolate_environ(monkeypatch, ["_MLFLOW_TELEMETRY_SESSION_ID", "WANDB_SERVICE"])
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name, folder in (("WANDB_CONFIG_DIR", "wandb-config"), ("WANDB_CACHE_DIR", "wandb-cache"),
                         ("WANDB_DATA_DIR", "wandb-data")):
        monkeypatch.setenv(name, str(tmp_path / folder))
    yield wandb
    wandb.teardown()


def files_holding(root, needle: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes())


def test_no_record_of_a_run_holds_a_secret_of_a_uri(tmp_path, capfd, wandb_offline):
    from trackers_support import wandb_runs

    out = tmp_path / "run"
    common = ("train.epochs=2", "checkpoint.every_steps=5", "log.trackers=wandb",
              f"log.mlflow_tracking_uri=http://alice:{SECRET}@127.0.0.1:9/", f"data.path=https://bob:{SECRET}@data/x")
    fit(out, *common)
    assert not files_holding(out, SECRET), files_holding(out, SECRET)  # config.yaml, manifests, W&B's files
    assert "http://***@127.0.0.1:9/" in (out / "config.yaml").read_text()
    manifests = list((out / "checkpoints").glob("*/manifest.json"))
    assert manifests and all("https://***@data/x" in m.read_text() for m in manifests)
    (run,) = wandb_runs(out / "wandb").values()
    assert run["config"]["log.mlflow_tracking_uri"] == "http://***@127.0.0.1:9/"
    assert run["config"]["data.path"] == "https://***@data/x"
    # the resume compares the saved (redacted) data.path with this run's: the same run, not refused
    fit(out, *common, "train.epochs=3", "checkpoint.resume=true")
    assert not files_holding(out, SECRET)
    captured = capfd.readouterr()
    assert SECRET not in captured.out + captured.err


@pytest.mark.parametrize("where", ["config", "environment"])
def test_the_cannot_reach_error_hides_the_secret(tmp_path, monkeypatch, where):
    pytest.importorskip("mlflow")
    from trackers_support import free_port

    from hvdtrain.observability.trackers import TrackerError

    isolate_environ(monkeypatch, ["_MLFLOW_TELEMETRY_SESSION_ID"])
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    port = free_port()
    uri = f"http://alice:{SECRET}@127.0.0.1:{port}"
    overrides = ["log.trackers=mlflow"]
    if where == "config":
        overrides.append(f"log.mlflow_tracking_uri={uri}")
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(TrackerError) as caught:
        fit(tmp_path / "down", *overrides)
    assert f"cannot reach the MLflow tracking server at http://***@127.0.0.1:{port}" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_the_keys_listing_hides_the_secret(monkeypatch):
    from click.testing import CliRunner

    from hvdtrain.cli import main

    isolate_environ(monkeypatch, ["TF_CPP_MIN_LOG_LEVEL"])
    result = CliRunner().invoke(main, ["recipe", "image-classification", "--keys", "--set",
                                       f"log.mlflow_tracking_uri=http://alice:{SECRET}@h:5000"], catch_exceptions=False)
    assert result.exit_code == 0 and "log.mlflow_tracking_uri = 'http://***@h:5000'" in result.stdout
    assert SECRET not in result.stdout + result.stderr
