"""Worker for tests/distributed/test_prepare.py: the same task trained by the Trainer and by a plain
torch loop through ``hvdtrain.torch.prepare``, per gradient exchange, in one job; then the
example's own loop (examples/own_loop_torch.py) uninterrupted, and stopped after an update as a
killed job would be (its ranks raise, as if they died).

``python own_loop.py REPORT_JSON ROOT``, under ``horovodrun -np 2``. Rank 0 writes the report: per
exchange, the final weights of both runs and the exchange that ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from hvdtrain.core.registry import define_recipe, register_recipe
from hvdtrain.core.resolve import load_config
from hvdtrain.core.task import TrainTask
from hvdtrain.torch import prepare
from hvdtrain.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import own_loop_torch  # noqa: E402

N, FEATURES, CLASSES, BATCH, EPOCHS = 64, 16, 8, 4, 2
EXCHANGES = {"allreduce": [],
             "powersgd": ["comm.compression=powersgd", "comm.powersgd_rank=1", "comm.powersgd_min_size=256"],
             "zero2": ["parallel.shard_optimizer=gradients"]}


def data() -> tuple[TensorDataset, TensorDataset]:
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.normal(size=(N + 16, FEATURES)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, CLASSES, size=N + 16))
    return TensorDataset(x[:N], y[:N]), TensorDataset(x[N:], y[N:])


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def weights(model: torch.nn.Module) -> list:
    return [p.detach().cpu().numpy().tolist() for p in model.parameters()]


def by_trainer(root: Path, keys: list[str]) -> tuple[list, int]:
    seen = {}

    def task(config, ctx):
        model, optimizer = model_and_optimizer()
        seen["model"] = model
        train, val = data()
        return TrainTask(model=model, optimizer=optimizer, loss_fn=F.cross_entropy, train_data=train,
                         val_data=val, metric_sums=lambda out, y: {"correct": (out.argmax(1) == y).sum()})

    define_recipe("own-loop-parity", description="prepare() against the Trainer", defaults={}, replace=True)
    register_recipe("own-loop-parity", framework="torch", replace=True)(task)
    config = load_config({}, overrides=["framework=torch", "recipe=own-loop-parity", f"train.epochs={EPOCHS}",
                                        f"train.batch_size={BATCH}", "train.log_every=0", "train.tensorboard=false",
                                        "train.progress_bar=false", f"output={root}", *keys])
    trainer = Trainer(config)
    trainer.fit()
    return weights(seen["model"]), trainer.ctx.rank


def by_own_loop(keys: list[str]) -> tuple[list, str]:
    model, optimizer = model_and_optimizer()
    run = prepare(model, optimizer, data()[0], overrides=[f"train.batch_size={BATCH}", *keys])
    for _ in run.epochs(EPOCHS):
        for x, y in run.data:
            F.cross_entropy(run.model(x), y).backward()
            run.optimizer.step()
    return weights(run.model), type(run.adapter.exchange).__name__


def main() -> None:
    report_path, root = Path(sys.argv[1]), Path(sys.argv[2])
    report, rank = {}, 0
    for name, keys in EXCHANGES.items():
        trainer_weights, rank = by_trainer(root / f"trainer-{name}", keys)
        own_weights, exchange = by_own_loop(keys)
        report[name] = {"trainer": trainer_weights, "own": own_weights, "exchange": exchange}
    # the example: uninterrupted, and stopped after update 7 (step checkpoints every 3 updates)
    example = ["--samples", "256", "--batch-size", "16", "--epochs", "2", "--checkpoint-every", "3"]
    own_loop_torch.main([*example, "--output", str(root / "example-reference")])
    own_loop_torch.os._exit = _raise  # the example "dies" at --stop-after: every rank stops there
    try:
        own_loop_torch.main([*example, "--output", str(root / "example-run"), "--stop-after", "7"])
    except Killed:
        report["stopped"] = True
    if rank == 0:
        report_path.write_text(json.dumps(report))


class Killed(Exception):
    """Stands for the process dying at ``--stop-after``."""


def _raise(code: int) -> None:
    raise Killed(code)


if __name__ == "__main__":
    main()
