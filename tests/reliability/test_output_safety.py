"""A run never deletes what it did not create (issue 22, item 5), through the real CLI.

``hvdtrain recipe bert-finetune --model ./model --output .`` used to train, then export into
``./model``, deleting the pretrained model the run had started from. It is refused before
training now, naming the folder, and the directory is byte-identical afterwards. (The output lock,
a used output and a torn metrics line are shown in-process: ``tests/fast/test_output_dir.py``.)
"""

from __future__ import annotations

import os
import shutil

import pytest

from jobs import hvdtrain_cli, run

pytestmark = pytest.mark.resume


def tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_bert_export_never_replaces_the_model_the_run_starts_from(tmp_path):
    pretrained = pytest.importorskip("hvdtrain_recipes.bert_finetune.pretrained")
    source = pretrained.embedded_model_dir()
    shutil.copytree(source, tmp_path / "model", copy_function=os.link)  # the user's model folder (hard links)
    before = tree(tmp_path)
    proc = run([hvdtrain_cli(), "recipe", "bert-finetune", "--framework", "torch", "--model", "./model",
                "--output", ".", "--epochs", "1", "--set", "data.max_train_samples=16",
                "--set", "data.max_val_samples=16", "--set", "train.tensorboard=false"],
               cwd=tmp_path, check=False, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hvdtrain: error: model is the model this run starts from"), proc.stderr[-2000:]
    assert tree(tmp_path) == before  # ./model untouched, nothing written beside it
