"""Remote shards streamed on 2 ranks (issue 25, item 2): WebDataset tars of real photos served by the
project's nginx (scripts/http-server.sh, started here on loopback), trained with torch from
``http://127.0.0.1:PORT/...`` in streaming mode (image.read=auto streams URLs): each rank streams
its own lane of whole shards through a spool of 2; a run whose rank 1 is killed mid-epoch resumes
from its step checkpoint and ends bitwise equal to an uninterrupted run; no spool folder is left
behind (the killed run's are removed by the resumed run)."""

import io
import json
import os
import shutil
import tarfile

import pytest

from http_server import http_server
from jobs import assert_same_run, checkpoint_weights, horovodrun, hvdtrain_cli, run_metrics

from benchmarks import photo_tree  # noqa: E402

NGINX = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
if (not photo_tree.available() or not NGINX) and os.environ.get("CI") != "true":
    pytest.skip("needs scikit-image's photos (scripts/install.sh) and nginx (scripts/http-server.sh --setup)",
                allow_module_level=True)

SHARDS = 6  # per split: 3 per lane
# 120 training photos / 2 ranks / batch 16 = 4 steps per epoch (the last of 12); a checkpoint every
# 2 steps; the kill at step 7 (in epoch 2) leaves step-00000006 as the latest.
KILL_AT = 7


def write_tars(tree, dest):
    """WebDataset tars (``<key>.jpg`` + ``<key>.cls``, written with tarfile) of each split of a photo
    tree, the samples of a split dealt over :data:`SHARDS` shards, and a manifest with the classes."""
    classes = sorted(os.listdir(tree / "train"))
    for split in ("train", "val"):
        files = [(c, f) for c in classes for f in sorted(os.listdir(tree / split / c))]
        (dest / split).mkdir(parents=True)
        for k in range(SHARDS):
            with tarfile.open(dest / split / f"{split}-{k:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
                for cls, name in files[k::SHARDS]:
                    key = f"{cls}_{name.split('.')[0]}"
                    for member, data in ((f"{key}.jpg", (tree / split / cls / name).read_bytes()),
                                         (f"{key}.cls", str(classes.index(cls)).encode())):
                        info = tarfile.TarInfo(member)
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
    (dest / "manifest.json").write_text(json.dumps({"format": "webdataset", "classes": classes}))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Photo tars (4 classes, 30 + 8 photos each) served over HTTP with range requests."""
    base = tmp_path_factory.mktemp("served")
    tree = photo_tree.make_tree(base / "photos", classes=4, train=30, val=8, size=(200, 150))
    write_tars(tree, base / "wds")
    with http_server(base, "wds/manifest.json") as url:
        yield url + "/wds"


@pytest.mark.distributed
def test_two_ranks_stream_http_shards_and_a_killed_run_resumes_bitwise(tmp_path, server):
    spool = tmp_path / "spool"
    env = {"HVDTRAIN_DATA_CACHE": str(tmp_path / "cache")}
    last = f"{SHARDS - 1:06d}"

    def command(out, *extra):
        return [hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--data", server,
                "--output", out, "--epochs", "2", "--model", "small_cnn", "--batch-size", "16", "--lr", "0.02",
                "--set", f"image.train_shards=train/train-{{000000..{last}}}.tar",
                "--set", f"image.val_shards=val/val-{{000000..{last}}}.tar",
                "--set", "image.size=32", "--set", "image.workers=1", "--set", "image.spool_shards=2",
                "--set", f"image.spool_dir={spool}", "--set", "checkpoint.every_steps=2",
                "--set", "train.deterministic=true", "--set", "train.log_every=0", "--set", "optim.warmup_epochs=0",
                "--set", "train.tensorboard=false", *extra]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    first = horovodrun(command(straight), env=env, timeout=300)
    assert "120 train / 32 val" in first.stdout
    assert f"streamed from {server}/train in 2 lane(s), spool of up to 2 shards" in first.stdout
    rows = run_metrics(straight)
    assert len(rows) == 2 and rows[-1]["world_size"] == 2 and 0 <= rows[-1]["val_accuracy"] <= 1
    assert not list(spool.iterdir())  # each rank removed its spool at exit

    crash = horovodrun(command(killed), check=False, timeout=300,
                       env={**env, "HVDTRAIN_FAULT": f"kill:rank=1:step={KILL_AT}"})
    assert crash.returncode != 0
    names = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert "step-00000006" in names and "epoch-0002" not in names, names
    resumed = horovodrun(command(killed, "--resume"), env=env, timeout=300)
    assert "step-00000006" in resumed.stdout and "index cached" in resumed.stdout
    assert_same_run(checkpoint_weights(straight / "checkpoints" / "epoch-0002", "torch"),
                    checkpoint_weights(killed / "checkpoints" / "epoch-0002", "torch"), straight, killed)
    assert not list(spool.iterdir())  # what the killed ranks left was removed by the resumed run
