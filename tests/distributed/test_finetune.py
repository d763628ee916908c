"""Fine-tuning a torchvision-layout ResNet-18 on 2 ranks under horovodrun, both frameworks: the
weights file (written here with torch, a 1000-class head as torchvision's) is what every rank starts
from, the backbone is frozen for epoch 1 (parameters and BatchNorm statistics bitwise unchanged on
every rank while the head learns) and trains from epoch 2 at ``optim.backbone_lr_factor`` times the
head's rate; every rank holds the same weights after every epoch."""

import json
import os

import pytest

from jobs import REPO, horovodrun

from benchmarks import photo_tree  # noqa: E402

WORKER = REPO / "tests" / "distributed" / "workers" / "finetune_ranks.py"

if not photo_tree.available() and os.environ.get("CI") != "true":
    pytest.skip("scikit-image's photos are not installed (scripts/install.sh adds scikit-image==0.26.0)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_tree.make_tree(tmp_path_factory.mktemp("photos"), classes=4, train=16, val=4, size=(96, 72))


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A ResNet-18 at 64 pixels (torchvision's 7x7 stem) with a 1000-class fc, as .pth and .safetensors."""
    torch = pytest.importorskip("torch")
    from hvdtrain_recipes.image_classification import torch_models
    from hvdtrain_recipes.image_classification.torchvision_weights import save_torchvision_resnet

    torch.manual_seed(3)
    model = torch_models.build_model("resnet18", 3, (64, 64), 1000)
    folder = tmp_path_factory.mktemp("weights")
    save_torchvision_resnet(model, folder / "resnet18.pth")
    save_torchvision_resnet(model, folder / "resnet18.safetensors")
    return folder


@pytest.mark.distributed
@pytest.mark.parametrize("framework,suffix", [("torch", ".safetensors"), ("tensorflow", ".pth")])  # .pth: no torch
def test_frozen_backbone_then_factor_on_two_ranks(tmp_path, photos, weights, framework, suffix):
    report = tmp_path / "report.json"
    horovodrun(["python", WORKER, report, framework, f"data.path={photos}", f"output={tmp_path / 'run'}",
                "model.name=resnet18", f"model.pretrained={weights / ('resnet18' + suffix)}",
                "model.freeze_backbone_epochs=1", "optim.backbone_lr_factor=0.1", "optim.weight_decay=1e-4",
                "train.epochs=2", "train.batch_size=8", "optim.lr=0.05", "optim.warmup_epochs=0",
                "image.size=64", "image.workers=1", "train.log_every=0"],
               env={"HVDTRAIN_DATA_CACHE": str(tmp_path / "cache")})
    rows = json.loads(report.read_text())["rows"]
    assert [r["when"] for r in rows] == ["start", "epoch 1", "epoch 2"]
    for row in rows:  # every rank holds the same backbone and head
        assert len(row["ranks"]) == 2 and row["ranks"][0] == row["ranks"][1], row
    start, epoch1, epoch2 = (row["ranks"][0] for row in rows)
    assert start["conv1_is_the_files"] and epoch1["conv1_is_the_files"]  # the file's weights, then frozen
    assert epoch1["backbone"] == start["backbone"]  # no update at all: no decay, no momentum, no BN statistics
    assert epoch1["head"] != start["head"]  # ... while the head learned
    assert epoch2["backbone"] != epoch1["backbone"] and not epoch2["conv1_is_the_files"]
    assert epoch2["head"] != epoch1["head"]
