"""Every rank trains the same data (issue 22, item 10): two ranks whose hosts see different files at
the same path (here: the same relative ``--data data`` resolved in a per-rank folder, as two hosts
with a stale copy would) stop before the first step with one line naming the ranks and hosts,
instead of training silently wrong (same count, other labels) or hanging at the epoch end (other
counts: the same check, see tests/unit/test_dataset_check.py)."""

import shlex

import numpy as np
import pytest
from PIL import Image

from jobs import horovodrun, hvdtrain_cli


def image_tree(root, per_class=8):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), mode="L").save(
                    root / split / cls / f"{i}.png")
    return root


@pytest.mark.distributed
def test_ranks_that_see_different_trees_stop_before_the_first_step(tmp_path):
    image_tree(tmp_path / "rank0" / "data")
    stale = image_tree(tmp_path / "rank1" / "data")  # the same count, one image under another class
    (stale / "train" / "b" / "0.png").rename(stale / "train" / "a" / "8.png")
    out = tmp_path / "out"
    cli = " ".join(shlex.quote(str(a)) for a in [
        hvdtrain_cli(), "recipe", "image-classification", "--framework", "torch", "--data", "data", "--output", out,
        "--epochs", "1", "--batch-size", "4", "--set", "train.log_every=0", "--set", "image.workers=0"])
    script = f'cd {shlex.quote(str(tmp_path))}/rank"${{HOROVOD_RANK:-$OMPI_COMM_WORLD_RANK}}" && exec {cli}'
    proc = horovodrun(["sh", "-c", script], check=False, timeout=300,
                      env={"HVDTRAIN_DATA_CACHE": str(tmp_path / "cache")})
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "see different training data" in line]
    assert proc.returncode != 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]  # was: exit 0, trained
    assert "rank 0 on " in lines[0] and "rank 1 on " in lines[0] and "16 samples, fingerprint" in lines[0]
    assert not [line for line in proc.stderr.splitlines() if "]<stderr>:Traceback" in line]  # only the launcher's
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()
