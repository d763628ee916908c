"""End to end: the image-classification recipe through the `hvdtrain` CLI under real launchers.

* 2 ranks (`horovodrun --gloo`) on a 12,000-image MNIST subset reach >= 90% validation accuracy on
  1,000 held-out images in one epoch (seed 42), for torch and TensorFlow; `metrics.jsonl`,
  `config.yaml` and a checkpoint are written; a second 2-rank run into the same output without
  `--resume` is refused and changes nothing (torch: the refusal is the resume plan that rank 0
  broadcasts, the same for both frameworks; TensorFlow's broadcast of that plan runs in every
  TensorFlow resume of tests/reliability; the rule itself, in-process: tests/fast/test_output_dir.py
  and tests/reliability/test_bad_input.py's "used output without --resume"; resume itself:
  tests/reliability and tests/fast).
* plain `mpirun -np 2` and a single process (no launcher) run the same command.
"""

import json

import pytest
import yaml

from jobs import BIN, horovodrun, hvdtrain_cli, run

SUBSET = ["--set", "data.max_train_samples=12000", "--set", "data.max_val_samples=1000", "--set", "train.log_every=0"]
TINY = ["--set", "data.max_train_samples=512", "--set", "data.max_val_samples=256", "--set", "train.log_every=0",
        "--epochs", "1"]
METRIC_KEYS = {"epoch", "train_loss", "val_loss", "val_accuracy", "samples_per_sec", "world_size"}


def read_metrics(output):
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]


def checkpoint_names(output):
    return sorted(p.name for p in (output / "checkpoints").iterdir())


@pytest.mark.e2e
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_two_ranks_reach_accuracy_and_a_used_output_is_refused(tmp_path, framework):
    out = tmp_path / "run"
    cmd = [hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *SUBSET]

    first = horovodrun(cmd + ["--epochs", "1"])
    rows = read_metrics(out)
    assert len(rows) == 1 and METRIC_KEYS <= rows[0].keys()
    assert rows[0]["epoch"] == 1 and rows[0]["world_size"] == 2
    assert rows[0]["val_accuracy"] >= 0.90, rows
    assert "hvdtrain: done" in first.stdout and first.stdout.count("hvdtrain: done") == 1  # rank 0 only
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["framework"] == framework and saved["data"]["max_train_samples"] == 12000
    assert checkpoint_names(out) == ["epoch-0001"]
    manifest = json.loads((out / "checkpoints" / "epoch-0001" / "manifest.json").read_text())
    assert manifest["epoch"] == 1 and manifest["framework"] == framework and manifest["world_size"] == 2

    if framework != "torch":
        return  # the refusal below is the same plan broadcast for both frameworks (module docstring)
    before = (out / "metrics.jsonl").read_bytes()
    refused = horovodrun(cmd + ["--epochs", "2"], check=False)
    assert refused.returncode != 0
    assert "--resume" in refused.stdout + refused.stderr
    assert (out / "metrics.jsonl").read_bytes() == before and checkpoint_names(out) == ["epoch-0001"]


@pytest.mark.distributed
def test_plain_mpirun(tmp_path):
    out = tmp_path / "run"
    run([BIN / "mpirun", "-np", "2", "--bind-to", "none", hvdtrain_cli(), "recipe", "image-classification",
         "--framework", "torch", "--output", out, *TINY])
    rows = read_metrics(out)
    assert rows[-1]["world_size"] == 2 and METRIC_KEYS <= rows[-1].keys()


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_single_process_without_launcher(tmp_path, framework):
    out = tmp_path / "run"
    run([hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--output", out, *TINY])
    rows = read_metrics(out)
    assert rows[-1]["world_size"] == 1 and METRIC_KEYS <= rows[-1].keys()
