"""bert-finetune with pipeline stages under real `horovodrun -np 4 -H localhost:4 --gloo`, torch and
TensorFlow, on a tiny BERT without dropout (random weights, its own tokenizer) and real
movie-review sentences: one epoch with 2 stages x 2 replicas (embeddings + first layer | second
layer + head, 2 micro-batches) ends with the weights and validation metrics of a data-parallel run
on 2 workers with the same global batch, within float32 round-off; its checkpoint has the
data-parallel format, and its export (written by rank 0 after training) holds the trained weights of
both stages. A pipelined run that would export without checkpoints is refused before training.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from jobs import REPO, checkpoint_weights, horovodrun, hvdtrain_cli, run_metrics

sys.path.insert(0, str(REPO / "tests" / "distributed" / "workers"))

pytest.importorskip("transformers")
pytest.importorskip("keras_hub")

from bert_tiny_model import tiny_bert_run_files  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT without dropout (so the runs are comparable), 128 training and 64 validation rows."""
    return tiny_bert_run_files(tmp_path_factory.mktemp("bert"), 128, 64, dropout=0.0)


def bert(tiny, framework, output, *extra):
    sets = {"text.val_path": tiny["val"], "train.log_every": 0, "train.progress_bar": False,
            "train.tensorboard": False, "train.deterministic": True, "optim.name": "sgd", "optim.momentum": 0.9,
            "optim.warmup_epochs": 0}
    return [hvdtrain_cli(), "recipe", "bert-finetune", "--framework", framework, "--model", tiny["model"],
            "--data", tiny["train"], "--text-column", "sentence", "--label-column", "sentiment",
            "--max-length", "32", "--batch-size", "8", "--lr", "0.05", "--epochs", "1", "--output", output,
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")], *extra]


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_pipelined_bert_trains_like_data_parallel_bert(tmp_path, tiny, framework):
    horovodrun(bert(tiny, framework, tmp_path / "dp"), np=2, timeout=400)
    piped = horovodrun(bert(tiny, framework, tmp_path / "pp", "--set", "parallel.pipeline_stages=2",
                            "--set", "parallel.micro_batches=2"), np=4, timeout=400)
    assert "hvdtrain: done" in piped.stdout
    dp = checkpoint_weights(tmp_path / "dp" / "checkpoints" / "epoch-0001", framework)
    pp = checkpoint_weights(tmp_path / "pp" / "checkpoints" / "epoch-0001", framework)
    assert dp.keys() == pp.keys()
    worst = max(float(np.abs(dp[k].astype(np.float64) - pp[k]).max()) for k in dp)
    assert worst <= 1e-5, worst
    dp_row, pp_row = run_metrics(tmp_path / "dp")[0], run_metrics(tmp_path / "pp")[0]
    assert pp_row["world_size"] == 4
    assert abs(dp_row["train_loss"] - pp_row["train_loss"]) <= 1e-5, (dp_row, pp_row)
    assert abs(dp_row["val_loss"] - pp_row["val_loss"]) <= 1e-5, (dp_row, pp_row)
    assert dp_row["val_accuracy"] == pp_row["val_accuracy"]
    dp_export, pp_export = exported_weights(tmp_path / "dp", framework), exported_weights(tmp_path / "pp", framework)
    assert len(dp_export) == len(pp_export) > 0
    assert max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(dp_export, pp_export)) <= 1e-5


def exported_weights(run_dir, framework):
    """The floating-point weights of a run's export (``RUN_DIR/model``), in the model's order (Keras'
    integer seed-generator states count calls, which micro-batches multiply)."""
    if framework == "torch":
        from safetensors.numpy import load_file

        saved = load_file(run_dir / "model" / "model.safetensors")
        return [saved[k] for k in sorted(saved) if saved[k].dtype.kind == "f"]
    import keras
    import keras_hub  # noqa: F401  (registers the classifier's classes for loading)

    model = keras.saving.load_model(run_dir / "model" / "model.keras")
    return [a for a in (np.asarray(v.numpy()) for v in model.variables) if a.dtype.kind == "f"]


@pytest.mark.distributed
def test_pipelined_export_without_checkpoints_is_refused_before_training(tmp_path, tiny):
    # 2 stages x 1 replica: the refusal needs stages, not replicas (half the workers of -np 4 to start)
    proc = horovodrun(bert(tiny, "torch", tmp_path / "run", "--set", "parallel.pipeline_stages=2",
                           "--set", "checkpoint.enabled=false"), np=2, timeout=300, check=False)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "checkpoint.enabled=false" in output and "set checkpoint.enabled=true" in output, output[-3000:]
    assert "<stderr>:Traceback" not in output  # one line per worker (horovodrun adds its own traceback)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
