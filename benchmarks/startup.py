"""Start-up on an ImageNet-shaped tree (benchmarks/startup_tree.py: 1,281,167 files, 1,000 classes):
seconds from process start to the end of the first training step, with a cold index (no cache)
and with the cached one, and the index's size per rank. Every rank runs this under horovodrun;
the first step ends the job (a callback exits every rank once it has finished step 1).

    .venv/bin/python benchmarks/startup_tree.py /tmp/imagenet-shaped
    rm -rf /tmp/hvdtrain-startup-cache   # cold
    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/startup.py /tmp/imagenet-shaped /tmp/startup-cold.json
    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/startup.py /tmp/imagenet-shaped /tmp/startup-cached.json
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hvdtrain  # noqa: E402


class FirstStep(hvdtrain.Callback):
    """Records the first step's end on every rank, writes the timings, then ends the process."""

    def __init__(self, out: str):
        self.out = out

    def on_step_end(self, epoch, step, logs):
        import horovod.torch as hvd

        elapsed = time.time() - STARTED
        record = {"rank": hvd.rank(), "first_step_sec": elapsed,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "index_mb": LOADED["index_mb"], "index_built_here": LOADED["built"],
                  "index_sec": LOADED["index_sec"]}
        records = hvd.allgather_object(record)
        if hvd.rank() == 0:
            Path(self.out).write_text(json.dumps(records, indent=1))
            print(json.dumps(records), flush=True)
        os._exit(0)  # every rank got here (the allgather above); the data workers die with it


LOADED: dict = {}


def main() -> None:
    root, out = sys.argv[1], sys.argv[2]
    os.environ.setdefault("HVDTRAIN_DATA_CACHE", "/tmp/hvdtrain-startup-cache")
    import hvdtrain_recipes.image_classification.common as common

    original = common.open_images

    def timed_open(*args, **kwargs):
        started = time.time()
        data = original(*args, **kwargs)
        LOADED.update(index_sec=time.time() - started, built=data.train.index.built,
                      index_mb=(data.train.index.nbytes + data.val.index.nbytes) / 2**20)
        return data

    common.open_images = timed_open  # the recipe's one call into hvdtrain.data
    with tempfile.TemporaryDirectory(prefix="hvdtrain-startup-") as tmp:
        config = hvdtrain.load_config(hvdtrain.get_recipe("image-classification").defaults, recipe="image-classification",
                                      framework="torch", overrides=[
                                          f"data.path={root}", f"output={tmp}/run", "model.name=small_cnn",
                                          "image.size=32", "train.batch_size=32", "train.log_every=0",
                                          "train.tensorboard=false", "train.progress_bar=false", "image.workers=1"])
        hvdtrain.train(config, callbacks=[FirstStep(out)])


if __name__ == "__main__":
    main()
