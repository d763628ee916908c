"""bert-finetune with pipeline stages under real `horovodrun -np 4 -H localhost:4 --gloo`, torch and
TensorFlow, on a tiny BERT without dropout (random weights, its own tokenizer) and real
movie-review sentences: one epoch with 2 stages x 2 replicas (embeddings + first layer | second
layer + head, 2 micro-batches) ends with the weights and validation metrics of a data-parallel run
on 2 workers with the same global batch, within float32 round-off, and its checkpoint has the
data-parallel format.
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
