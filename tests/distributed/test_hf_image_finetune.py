"""Fine-tuning Hugging Face image models with the image-classification recipe under real
`horovodrun -np 2 -H localhost:2 --gloo`: a tiny ConvNeXt in torch (transformers), a tiny ViT in
TensorFlow (keras-hub), each saved with ``save_pretrained`` and a hub-style preprocessor config,
on a small ImageFolder tree of colour PNGs.

* after 2 epochs the parameters are identical on both ranks and moved from the pretrained start
  (torch with ``model.freeze_backbone_epochs=2``: only the ``classifier`` head moved);
  the run used the checkpoint's preprocessing (ConvNeXt: resize + centre crop; ViT: squash);
* the export (`RUN_DIR/model`) is written and `hvdtrain predict RUN_DIR IMAGE...` classifies every
  validation file with it, agreeing with the run's last val_accuracy (same transform, same
  model); a file that is not an image is a one-line error naming it.
"""

from __future__ import annotations

import json
import sys

import pytest

from envguard import isolate_environ
from jobs import REPO, horovodrun, hvdtrain_cli, run

WORKERS = REPO / "tests" / "distributed" / "workers"
sys.path.insert(0, str(WORKERS))

pytest.importorskip("transformers")
pytest.importorskip("keras_hub")

from hf_image_tiny import color_tree, save_tiny_model  # noqa: E402

MODELS = {"torch": ("convnext", "imagenet: train: RandomResizedCrop 32"), "tensorflow": ("vit", "pad-crop")}
FROZEN = {"torch": 2, "tensorflow": 0}  # torch trains only the head (model.freeze_backbone_epochs), TensorFlow all
QUIET = {"train.log_every": 0, "train.progress_bar": False, "train.tensorboard": False}


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch):
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR",))  # set by torch when transformers saves a model


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return color_tree(tmp_path_factory.mktemp("colours"))


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_two_ranks_fine_tune_a_hf_model_then_predict_files(tmp_path, tree, framework):
    model_type, transform = MODELS[framework]
    model = save_tiny_model(tmp_path / model_type, model_type)
    out, report_path = tmp_path / "run", tmp_path / "report.json"
    settings = {"model.name": model, "data.path": tree, "output": out, "train.epochs": 2, "train.batch_size": 8,
                "optim.lr": 0.02, "image.workers": 1, "model.freeze_backbone_epochs": FROZEN[framework], **QUIET}
    proc = horovodrun(["python", WORKERS / "hf_image_ranks.py", report_path, framework,
                       *[f"{k}={v}" for k, v in settings.items()]], timeout=400,
                      env={"HVDTRAIN_DATA_CACHE": str(tmp_path / "cache")})
    report = json.loads(report_path.read_text())
    assert report["world_size"] == 2
    assert report["moved"] > 1e-4, "training did not change the parameters: the spread check proves nothing"
    assert report["spread"] == 0.0
    assert report["head_moved"] > 1e-4  # the head is found by the recipe's TrainTask.head (HF: `classifier`)
    assert (report["backbone_moved"] == 0.0) if FROZEN[framework] else (report["backbone_moved"] > 1e-3), report
    assert len(report["history"]) == 2
    assert f"32x32x3, {transform}" in proc.stdout, proc.stdout  # the checkpoint's size and resize/crop

    export = out / "model"
    record = json.loads((export / "image_model.json").read_text())
    assert record["labels"] == ["blue", "green", "red"] and record["framework"] == framework
    assert (export / ("config.json" if framework == "torch" else "model.keras")).is_file()
    files = sorted((tree / "val").glob("*/*.png"))
    lines = run([hvdtrain_cli(), "predict", out, *files]).stdout.strip().splitlines()
    assert len(lines) == len(files) == 18
    correct = 0
    for line, file in zip(lines, files):
        label, probability, echoed = line.split("\t")
        assert echoed == str(file) and label in record["labels"] and 1 / 3 <= float(probability) <= 1.0
        correct += label == file.parent.name
    # the same model and transform as the run's validation (a near-tie may flip one file between graph and eager)
    assert abs(correct / len(files) - report["history"][-1]["val_accuracy"]) <= 1.01 / len(files)

    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    proc = run([hvdtrain_cli(), "predict", out, files[0], bad], check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"hvdtrain: error: {bad}: not a readable image" in proc.stderr and proc.stdout == ""
