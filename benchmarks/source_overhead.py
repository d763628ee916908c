"""What a map-style torch ``Dataset`` costs against the same data in ``hvdtrain.ArrayDataset``
(issue 38: at least 0.97): samples/s of the training steps, in-process (np=1, one intra-op thread),
the two sides interleaved (A B, B A, A B, ...) in one process on the same data.

Both sides train the image recipe's ``small_cnn`` (the suite's row 1 model) on the same 2,048
real MNIST images, batch 64, one epoch, no checkpoints. A: ``hvdtrain.ArrayDataset(x, y)`` (one
fancy-indexing per batch). B: a ``torch.utils.data.Dataset`` whose ``__getitem__`` returns
``(tensor image, int label)``, as users write one: hvdtrain reads it item by item and collates
each batch in its data worker processes (``hvdtrain.core.sources.MapSource`` read by
``hvdtrain.core.item_workers``, ``data.workers`` at its default: the cores of this rank, at most
4; started once per process, in the warm-up), or in its prefetch thread with ``--workers 0``.
The rate of each side is taken between the end of step 4 and the last step (a Callback's clock);
the ratio B/A per round, and its median, is printed with both sides' medians and the milliseconds
each side takes to read one batch (:func:`read_cost`)::

    .venv/bin/python benchmarks/source_overhead.py [ROUNDS (default 7)] [--workers N]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BATCH, SKIP_STEPS, StepClock, hvdtrain_overrides, mnist_arrays, steady_rate  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.core.resolve import load_config  # noqa: E402

N_TRAIN = 2048



def images_dataset() -> type:
    """The map-style torch Dataset a user brings: one image and its label per index (torch is
    imported here, as every torch import in this file is, so ``--help`` needs no framework)."""
    import torch

    class Images(torch.utils.data.Dataset):
        def __init__(self, x, y):
            self.x, self.y = torch.from_numpy(x), y

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i], int(self.y[i])

    return Images

def register(x, y, xv, yv) -> None:
    """Recipes ``bench-source-array`` (A) and ``bench-source-map`` (B): the same model and data."""
    import torch
    import torch.nn.functional as F

    from hvdtrain.torch import build_optimizer
    from hvdtrain_recipes.image_classification.torch_models import build_model

    Images = images_dataset()

    for name, wrap in (("array", hvdtrain.ArrayDataset), ("map", Images)):
        hvdtrain.define_recipe(f"bench-source-{name}", description="benchmarks: data source overhead", replace=True)

        def build(config, ctx, wrap=wrap):
            torch.manual_seed(config.train.seed)
            model = build_model(config.model.name, 1, (28, 28), 10)
            return hvdtrain.TrainTask(model, build_optimizer(model.parameters(), config.optim),
                                      lambda logits, labels: F.cross_entropy(logits, labels),
                                      wrap(x, y), wrap(xv, yv),
                                      metric_sums=lambda logits, labels: {"correct": (logits.argmax(1) == labels).sum()})

        hvdtrain.register_recipe(f"bench-source-{name}", framework="torch", replace=True)(build)


class Clock(hvdtrain.Callback):
    def __init__(self) -> None:
        self.clock = StepClock()

    def on_step_end(self, epoch, step, logs):
        self.clock.tick()


def rate(side: str, root: Path, index: int, workers: list[str]) -> float:
    """One epoch of side ``side`` ("array" or "map"): samples/s of its steady steps."""
    config = load_config({}, overrides=[f"recipe=bench-source-{side}", "framework=torch", *workers,
                                        *hvdtrain_overrides(str(root / f"{side}-{index}")),
                                        "train.tensorboard=false", "train.progress_bar=false"])
    clock = Clock()
    hvdtrain.Trainer(config, callbacks=[clock]).fit()
    return steady_rate(clock.clock.ends, BATCH, SKIP_STEPS)


def read_cost(x, y) -> dict[str, float]:
    """Milliseconds to read one batch of 64 from each side (median of 50 reads, this thread): the
    source's own cost, without the step it overlaps with (the loop reads in a prefetch thread)."""
    import numpy as np
    import torch

    from hvdtrain.core.sources import as_source

    Images = images_dataset()

    indices = np.random.default_rng(0).permutation(len(y))[:BATCH]
    cost = {}
    for side, source in (("array", hvdtrain.ArrayDataset(x, y)), ("map", as_source(Images(x, y)))):
        times = []
        for _ in range(50):
            started = time.perf_counter()
            source.get_batch(indices, 0)
            times.append((time.perf_counter() - started) * 1000)
        cost[f"{side}_read_ms"] = round(statistics.median(times), 3)
    return cost


def main() -> None:
    args = sys.argv[1:]
    workers = [f"data.workers={args.pop(args.index('--workers') + 1)}"] if "--workers" in args else []
    args = [a for a in args if a != "--workers"]
    rounds = int(args[0]) if args else 7
    x, y, xv, yv = mnist_arrays(N_TRAIN)
    register(x, y, xv, yv)
    started = time.time()
    array, mapped, ratios = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("array", "map"):  # warm-up: imports, first allocations, the data workers' start
            rate(side, Path(tmp), -1, workers)
        for k in range(rounds):
            order = ("array", "map") if k % 2 == 0 else ("map", "array")
            got = {side: rate(side, Path(tmp), k, workers) for side in order}
            array.append(got["array"])
            mapped.append(got["map"])
            ratios.append(got["map"] / got["array"])
            print(f"round {k + 1}: ArrayDataset {got['array']:.1f}, torch Dataset {got['map']:.1f} samples/s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    print(json.dumps({**read_cost(x, y), "workers": workers[0] if workers else "data.workers default", "array_median": statistics.median(array), "map_median": statistics.median(mapped),
                      "ratios": [round(r, 3) for r in ratios], "median_ratio": round(statistics.median(ratios), 3),
                      "minutes": round((time.time() - started) / 60, 1)}))


if __name__ == "__main__":
    main()
