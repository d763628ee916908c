"""The image recipe on a small tree of real-photo JPEGs (crops of scikit-image's photographs, about
200x150, quality 90), 2 ranks under horovodrun: both frameworks learn well above chance through the
worker-process pipeline (ImageNet transforms at 32 pixels); with ``image.bad_files=skip`` a corrupt
file on the way is replaced by a stand-in, every rank finishes the same steps, and the count is
reported; the run's export (`RUN_DIR/model`) classifies the validation photos through
`hvdtrain predict`, agreeing with the run's last val_accuracy."""

import json
import os

import pytest

from jobs import horovodrun, hvdtrain_cli, run

from benchmarks import photo_tree  # noqa: E402

if not photo_tree.available() and os.environ.get("CI") != "true":
    pytest.skip("scikit-image's photos are not installed (scripts/install.sh adds scikit-image==0.26.0)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_tree.make_tree(tmp_path_factory.mktemp("photos"), classes=4, train=60, val=15, size=(200, 150))


@pytest.mark.distributed
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_two_ranks_learn_real_photos(tmp_path, photos, framework):
    out = tmp_path / "run"
    extra, bad = [], photos / "train" / "coffee" / "00007.JPEG"
    original = bad.read_bytes()
    if framework == "torch":  # one corrupt JPEG, replaced by a stand-in on whichever rank meets it
        bad.write_bytes(original[:400])
        extra = ["--set", "image.bad_files=skip"]
    try:
        proc = horovodrun([hvdtrain_cli(), "recipe", "image-classification", "--framework", framework, "--data", photos,
                          "--output", out, "--model", "small_cnn", "--epochs", "6", "--batch-size", "16", "--lr", "0.02",
                          "--set", "image.size=32", "--set", "image.workers=1", "--set", "train.log_every=0",
                          "--set", "optim.warmup_epochs=0", *extra], env={"HVDTRAIN_DATA_CACHE": str(tmp_path / "cache")})
    finally:
        bad.write_bytes(original)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 6 and rows[-1]["world_size"] == 2
    assert rows[-1]["val_accuracy"] >= 0.6, rows  # chance: 0.25
    assert "imagenet: train: RandomResizedCrop 32" in proc.stdout
    if framework == "torch":
        assert "unreadable train image(s) replaced by stand-ins" in proc.stderr and "00007.JPEG" in proc.stderr
    files = sorted((photos / "val").glob("*/*.JPEG"))
    lines = run([hvdtrain_cli(), "predict", out, *files]).stdout.strip().splitlines()
    assert len(lines) == len(files)
    correct = sum(line.split("\t")[0] == file.parent.name for line, file in zip(lines, files))
    assert abs(correct / len(files) - rows[-1]["val_accuracy"]) <= 1.01 / len(files), (correct, rows[-1])
