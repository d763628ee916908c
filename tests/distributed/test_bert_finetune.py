"""bert-finetune under real `horovodrun -np 2 -H localhost:2 --gloo`, torch and TensorFlow, on a tiny
BERT (random weights, its own tokenizer) saved to a temporary directory: the path users take with
their own model, on real movie-review sentences from a CSV (train) and a JSONL file (validation).

* after training (with gradient accumulation), the parameters are identical on both ranks and
  differ from the pretrained start; accuracy and F1 are reported;
* `--resume` continues at epoch 2 from the checkpoint; the export (`RUN_DIR/model`) is written
  and `hvdtrain predict RUN_DIR TEXT...` classifies with it;
* bad input through the CLI exits non-zero with a message naming the problem, writing nothing.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from jobs import REPO, horovodrun, hvdtrain_cli, run

WORKERS = REPO / "tests" / "distributed" / "workers"
sys.path.insert(0, str(WORKERS))

pytest.importorskip("transformers")
pytest.importorskip("keras_hub")

from bert_tiny_model import tiny_bert_run_files  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT directory, a training CSV (160 rows) and a validation JSONL file (64 rows)."""
    return tiny_bert_run_files(tmp_path_factory.mktemp("bert"), 160, 64)


QUIET = {"train.log_every": 0, "train.progress_bar": False, "train.tensorboard": False}


def _settings(tiny, output):
    """The config of the tiny runs, as KEY=VALUE overrides."""
    return {"model.name": tiny["model"], "data.path": tiny["train"], "text.val_path": tiny["val"],
            "text.text_column": "sentence", "text.label_column": "sentiment", "text.max_length": 32,
            "train.batch_size": 8, "train.grad_accumulation": 2, "optim.lr": 1e-3, "output": output, **QUIET}


def _cli(tiny, framework, output, *extra):
    """The same run through the `hvdtrain recipe` command line and its text flags."""
    sets = {"text.val_path": tiny["val"], "train.grad_accumulation": 2, **QUIET}
    return [hvdtrain_cli(), "recipe", "bert-finetune", "--framework", framework, "--model", tiny["model"],
            "--data", tiny["train"], "--text-column", "sentence", "--label-column", "sentiment",
            "--max-length", "32", "--batch-size", "8", "--lr", "1e-3", "--output", output, *extra,
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_tiny_bert_two_ranks_identical_params_then_resume_and_predict(tmp_path, tiny, framework):
    out = tmp_path / "run"
    settings = _settings(tiny, out)
    report_path = tmp_path / "report.json"
    horovodrun(["python", WORKERS / "bert_ranks.py", report_path, framework,
                *[f"{k}={v}" for k, v in settings.items()], "train.epochs=1"], timeout=400)
    report = json.loads(report_path.read_text())
    assert report["world_size"] == 2
    assert report["moved"] > 1e-4, "training did not change the parameters: the spread check proves nothing"
    assert report["spread"] == 0.0
    first = report["history"][0]
    assert 0.0 <= first["val_accuracy"] <= 1.0 and 0.0 <= first["val_f1"] <= 1.0

    resumed = horovodrun(_cli(tiny, framework, out, "--epochs", "2", "--resume"), timeout=400)
    assert "at epoch 2" in resumed.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and rows[1]["world_size"] == 2
    assert json.loads((out / "labels.json").read_text())["labels"] == ["negative", "positive"]

    export = out / "model"
    model_file = "config.json" if framework == "torch" else "model.keras"
    for name in (model_file, "tokenizer.json", "labels.json"):
        assert (export / name).is_file(), sorted(p.name for p in export.iterdir())
    texts = ["A gorgeous, witty, seductive movie.", "Dull, lifeless and far too long."]
    lines = run([hvdtrain_cli(), "predict", out, *texts]).stdout.strip().splitlines()
    assert len(lines) == 2
    for line, text in zip(lines, texts):
        label, probability, echoed = line.split("\t")
        assert label in ("negative", "positive") and 0.5 <= float(probability) <= 1.0 and echoed == text


@pytest.mark.distributed
@pytest.mark.parametrize("problem", ["missing column", "model without tokenizer"])
def test_bad_input_exits_with_a_clear_error(tmp_path, tiny, problem):
    model, text_column = tiny["model"], "sentence"
    if problem == "missing column":
        text_column = "review"
        needles = ["no column 'review'", "--text-column", "sentiment, sentence", str(tiny["train"])]
    else:
        model = tmp_path / "no-tokenizer"
        shutil.copytree(tiny["model"], model, ignore=shutil.ignore_patterns("tokenizer.json"))
        needles = [str(model), "no tokenizer", "tokenizer.json"]
    args = ["--model", model, "--data", tiny["train"], "--text-column", text_column, "--label-column", "sentiment"]
    proc = run([hvdtrain_cli(), "recipe", "bert-finetune", *args, "--output", tmp_path / "out"], check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists() and not (tmp_path / "out" / "labels.json").exists()


@pytest.mark.distributed
def test_tiny_bert_tensorflow_with_powersgd_keeps_ranks_identical(tmp_path, tiny):
    """PowerSGD on BERT in TensorFlow: once batches of different padded lengths have relaxed the
    step's input shapes, the position embeddings' and feed-forward kernels' gradients reach the
    exchange without a static shape, which PowerSGD's matrices are built from (before the fix MiniLM
    failed with a TypeError while tracing, this tiny BERT in graph execution); every matrix
    compressed from the first step on."""
    report_path = tmp_path / "report.json"
    settings = {**_settings(tiny, tmp_path / "run"), "train.grad_accumulation": 1, "text.max_length": 64}
    horovodrun(["python", WORKERS / "bert_ranks.py", report_path, "tensorflow",
                *[f"{k}={v}" for k, v in settings.items()], "train.epochs=1", "comm.compression=powersgd",
                "comm.powersgd_rank=2", "comm.powersgd_min_size=0"], timeout=400)
    report = json.loads(report_path.read_text())
    assert report["moved"] > 1e-4, "training did not change the parameters: the spread check proves nothing"
    assert report["spread"] == 0.0
