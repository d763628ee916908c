"""One process through ``hvdtrain.torch.prepare`` (no launcher), for tests/unit/test_own_loop.py.

``python own_loop_script.py ROOT REPORT_JSON``: a small dropout network on 40 samples saves a step
checkpoint (update 3) and an epoch checkpoint (no metrics), then, each through a fresh prepare():

* ``outside``: the step checkpoint copied under ``ROOT/other/holder/checkpoints/`` beside a
  ``metrics.jsonl`` of 5 rows, and under ``ROOT/bare/holder/checkpoints/`` with none: loaded;
* ``past``: the output loaded by a run on 8 samples (the step checkpoint is 24 samples into epoch 1);
* ``model``: the output loaded by a run of another model;
* ``lr``: the output loaded by a run whose optimizer has another weight decay;
* ``resumed``: the output loaded as it is (the epoch checkpoint, written without metrics);
* ``again``: prepare() given what that prepare() returned.

What each call returned or raised goes to REPORT_JSON; warnings go to stderr.

``python own_loop_script.py signal OUTPUT REPORT_JSON``: ``prepare(..., save_on_signal=OUTPUT)``
resumes from OUTPUT (``run.load``) and trains 2 epochs of 5 updates; a first start sends itself
SIGINT (Ctrl-C) after update 2. A run that ends writes its final weights to REPORT_JSON.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from hvdtrain.torch import prepare

FEATURES = 6


def data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, FEATURES, generator=g), torch.randint(0, 3, (n,), generator=g))


def start(n: int = 40, hidden: int = 8, weight_decay: float = 0.0, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.Dropout(0.5), torch.nn.Linear(hidden, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=weight_decay)
    return prepare(model, optimizer, data(n), overrides=["train.batch_size=8"], **kwargs)


def attempt(what) -> object:
    try:
        return what()
    except Exception as exc:  # the report says what was raised
        return f"{type(exc).__name__}: {exc}"


def interrupted(out: Path, report_path: Path) -> None:
    """The ``signal`` mode (see the module's docstring)."""
    run = start(save_on_signal=out)
    first = not run.load(out)
    for _ in run.epochs(2):
        for x, y in run.data:
            torch.nn.functional.cross_entropy(run.model(x), y).backward()
            run.optimizer.step()
            if first and run.updates == 2:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C while the loop runs
    report_path.write_text(json.dumps([p.tolist() for p in run.model.parameters()]))


def main() -> None:
    if sys.argv[1] == "signal":
        return interrupted(Path(sys.argv[2]), Path(sys.argv[3]))
    root, report_path = Path(sys.argv[1]), Path(sys.argv[2])
    out = root / "run"
    run = start()
    for x, y in run.data:
        torch.nn.functional.cross_entropy(run.model(x), y).backward()
        run.optimizer.step()
        if run.updates == 3:
            run.save(out)
    run.save(out)  # the epoch's end, without metrics
    report: dict = {"manifests": {p.name: json.loads((p / "manifest.json").read_text())["data"]
                                  for p in sorted((out / "checkpoints").iterdir())}}
    step = out / "checkpoints" / "step-00000003"
    rows = "".join(json.dumps({"epoch": e, "step": 5 * e}) + "\n" for e in range(1, 6))
    for name, metrics in (("other", rows), ("bare", None)):
        holder = root / name / "holder"
        shutil.copytree(step, holder / "checkpoints" / step.name)
        if metrics is not None:
            (holder / "metrics.jsonl").write_text(metrics)
        loaded = start()
        report[f"outside-{name}"] = attempt(lambda: loaded.load(holder / "checkpoints" / step.name))
        report[f"outside-{name}-position"] = [loaded.epoch, loaded.position.consumed, loaded.updates]
    report["past"] = attempt(lambda: start(n=8).load(step))
    report["model"] = attempt(lambda: start(hidden=5).load(out))
    report["lr"] = attempt(lambda: start(weight_decay=0.01).load(out))
    resumed = start()
    report["resumed"] = [attempt(lambda: resumed.load(out)), resumed.epoch]
    report["again"] = attempt(lambda: prepare(resumed.model, resumed.optimizer, resumed.data))
    report_path.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
