"""``hvdtrain report RUN_DIR``: PNG plots of a run's curves and a one-page summary (matplotlib).

Reads ``metrics.jsonl`` (one line per epoch) and, when present, the TensorBoard event files rank 0
wrote next to it (one point per step), and writes into ``RUN_DIR/report/``. A run of your own loop
(``hvdtrain.torch.prepare``: recipe ``own-loop``) is read the same way: its rows are the metrics
your script passed to ``run.save`` (a ``loss`` is drawn as the training loss), and the number of
workers comes from its newest checkpoint's manifest. A folder without ``metrics.jsonl`` is named
with what it holds instead (checkpoints without metrics, a run's ``checkpoints/`` folder).

* ``loss.png``: step loss, and train/validation loss per epoch;
* ``accuracy.png``: validation accuracy (and any other ``val_*`` metric except loss) per epoch;
* ``lr.png``: learning rate per step (per epoch without event files);
* ``throughput.png``: samples/s per step and per epoch (all workers together);
* ``summary.png``: one page with the four curves, the final metrics and the run's settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hvdtrain.core.loop import CONFIG_FILE, METRICS_FILE
from hvdtrain.core.own_loop import RECIPE as OWN_LOOP

REPORT_DIR = "report"
PLOTS = ("loss", "accuracy", "lr", "throughput")
DPI = 110


class ReportError(ValueError):
    """RUN_DIR is not an hvdtrain output directory, or holds nothing to plot."""


@dataclass
class RunData:
    """What a report is drawn from."""

    run_dir: Path
    epochs: list[dict[str, Any]]
    steps: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def epoch_series(self, key: str) -> tuple[list[int], list[float]]:
        """Epoch numbers and values of ``key`` where the metrics line has it."""
        rows = [r for r in self.epochs if isinstance(r.get(key), (int, float))]
        return [r["epoch"] for r in rows], [float(r[key]) for r in rows]

    def step_series(self, tag: str) -> tuple[list[int], list[float]]:
        """Steps and values of the TensorBoard tag ``tag`` (empty without event files)."""
        points = self.steps.get(tag, [])
        return [p[0] for p in points], [p[1] for p in points]

    @property
    def steps_per_epoch(self) -> float | None:
        """Step-axis units per epoch, to draw epoch points on the step axis."""
        x, _ = self.step_series("step/loss")
        if not x or not self.epochs:
            return None
        return max(x) / max(r["epoch"] for r in self.epochs)


def load_run(run_dir: str | Path) -> RunData:
    """Read ``metrics.jsonl``, ``config.yaml`` and the event files of ``run_dir``."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILE
    if not metrics.is_file():
        raise ReportError(_no_metrics(run_dir))
    try:
        text = metrics.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"{metrics} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    epochs = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                epochs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ReportError(f"{metrics}:{number} is not valid JSON ({exc})") from None
            if not isinstance(epochs[-1], dict):
                raise ReportError(f"{metrics}:{number} is not a JSON object (one per epoch): {line[:60]}")
    if not epochs:
        raise ReportError(f"{metrics} is empty: no epoch finished yet")
    config_path = run_dir / CONFIG_FILE
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    steps: dict[str, list[tuple[int, float]]] = {}
    try:
        from hvdtrain.observability.tensorboard_log import read_scalars

        steps = read_scalars(run_dir)
    except ImportError:
        pass  # without the tensorboard package the per-epoch curves are drawn alone
    config = config if isinstance(config, dict) else {}
    if config.get("recipe") == OWN_LOOP and not any("world_size" in r for r in epochs):
        workers = _newest_manifest(run_dir).get("world_size")  # your loop's rows hold only your metrics
        if isinstance(workers, int):
            config = {**config, "workers": workers}
    return RunData(run_dir, epochs, steps, config)


def _recipe(run_dir: Path) -> str | None:
    """The recipe ``run_dir/config.yaml`` names, if it is readable."""
    try:
        saved = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return saved.get("recipe") if isinstance(saved, dict) else None


def _newest_manifest(run_dir: Path) -> dict[str, Any]:
    """The newest checkpoint's manifest under ``run_dir/checkpoints`` (``{}`` if none is readable)."""
    folders = sorted((run_dir / "checkpoints").glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(folders):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(manifest, dict):
            return manifest
    return {}


def _no_metrics(run_dir: Path) -> str:
    """What a folder without ``metrics.jsonl`` is, in one line, and what the report needs."""
    if run_dir.name == "checkpoints" and (run_dir.parent / METRICS_FILE).is_file():
        return f"{run_dir} is a run's checkpoints folder: report the run, `hvdtrain report {run_dir.parent}`"
    has_checkpoints = (run_dir / "checkpoints").is_dir()
    if _recipe(run_dir) == OWN_LOOP:
        return (f"{run_dir} has no {METRICS_FILE}: this run was trained by your own script (own-loop), which "
                f"saved no metrics yet; pass them as `run.save({str(run_dir)!r}, {{'loss': ...}})` at an epoch's "
                f"end and the report plots them")
    if has_checkpoints or (run_dir / CONFIG_FILE).is_file():
        return f"{run_dir} has no {METRICS_FILE} yet: no epoch finished with its metrics (its rows are the curves)"
    return f"{run_dir} has no {METRICS_FILE}: not an hvdtrain output directory, or no epoch finished yet"


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ReportError(f"hvdtrain report needs matplotlib ({exc}); install it with "
                          f"`pip install hvdtrain[report]`") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _epoch_x(data: RunData, epochs: list[int]) -> tuple[list[float], str]:
    """Epoch points placed on the step axis when there is one, else on an epoch axis."""
    per_epoch = data.steps_per_epoch
    if per_epoch:
        return [e * per_epoch for e in epochs], "step"
    return [float(e) for e in epochs], "epoch"


def _draw_loss(ax: Any, data: RunData) -> None:
    x, y = data.step_series("step/loss")
    if x:
        ax.plot(x, y, color="tab:blue", alpha=0.35, linewidth=0.8, label="train loss (rank 0, per step)")
    train_key = "train_loss" if data.epoch_series("train_loss")[0] else "loss"  # your own loop's "loss"
    for key, color, name in ((train_key, "tab:blue", "train loss (epoch)"),
                             ("val_loss", "tab:orange", "validation loss (epoch)")):
        epochs, values = data.epoch_series(key)
        if epochs:
            ex, _ = _epoch_x(data, epochs)
            ax.plot(ex, values, "o-", color=color, linewidth=1.8, label=name)
    ax.set_title("Loss")
    ax.set_xlabel("step" if x else "epoch")
    ax.set_ylabel("loss")


def _draw_accuracy(ax: Any, data: RunData) -> None:
    keys = [k for k in data.epochs[-1] if k.startswith("val_") and k != "val_loss"
            and isinstance(data.epochs[-1][k], (int, float))]
    for key in keys:
        epochs, values = data.epoch_series(key)
        ax.plot(epochs, values, "o-", linewidth=1.8, label=key.replace("val_", "validation "))
    ax.set_title("Validation accuracy" if keys == ["val_accuracy"] else "Validation metrics")
    ax.set_xlabel("epoch")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("accuracy" if keys == ["val_accuracy"] else "value")
    if not keys:
        ax.text(0.5, 0.5, "no validation metric besides the loss", ha="center", va="center",
                transform=ax.transAxes)


def _draw_lr(ax: Any, data: RunData) -> None:
    x, y = data.step_series("step/lr")
    if x:
        ax.plot(x, y, color="tab:green", linewidth=1.5, label="learning rate (per step)")
        ax.set_xlabel("step")
    else:
        epochs, values = data.epoch_series("lr")
        ax.plot(epochs, values, "o-", color="tab:green", label="learning rate (end of epoch)")
        ax.set_xlabel("epoch")
    ax.set_title("Learning rate")
    ax.set_ylabel("LR")


def _draw_throughput(ax: Any, data: RunData) -> None:
    x, y = data.step_series("step/samples_per_sec")
    if x:
        ax.plot(x, y, color="tab:purple", alpha=0.45, linewidth=0.8, label="running estimate (per step)")
    epochs, values = data.epoch_series("samples_per_sec")
    if epochs:
        ex, _ = _epoch_x(data, epochs)
        ax.plot(ex, values, "o-", color="tab:purple", linewidth=1.8, label="epoch average")
    ax.set_title("Throughput (all workers)")
    ax.set_xlabel("step" if x else "epoch")
    ax.set_ylabel("samples/s")


DRAWERS = {"loss": _draw_loss, "accuracy": _draw_accuracy, "lr": _draw_lr, "throughput": _draw_throughput}


def _finish(ax: Any) -> None:
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def summary_lines(data: RunData) -> list[tuple[str, str]]:
    """The settings and final metrics shown on the summary page (and printed by the command)."""
    cfg, final = data.config, data.epochs[-1]
    train, optim, model = cfg.get("train", {}), cfg.get("optim", {}), cfg.get("model", {})
    best = max((r for r in data.epochs if "val_accuracy" in r), key=lambda r: r["val_accuracy"], default=None)
    total_time = sum(r.get("epoch_time_sec", 0.0) for r in data.epochs)
    own = cfg.get("recipe") == OWN_LOOP
    lines = [
        ("run", str(data.run_dir)),
        ("recipe / framework", f"{cfg.get('recipe', '?')} / {cfg.get('framework', '?')}"),
        ("model", "your own (prepare())" if own else str(model.get("name", "?"))),
        ("workers", str(final.get("world_size", cfg.get("workers", "?")))),
        ("epochs", str(final.get("epoch")) if own else f"{final.get('epoch')} of {train.get('epochs', '?')}"),
        ("batch per worker", str(train.get("batch_size", "?"))),
        ("optimizer", f"{optim['ran']} (the task's own), LR {optim.get('lr', '?')} at the start" if optim.get("ran")
         else f"{optim.get('name', '?')}, base LR {optim.get('lr', '?')}, scaling {optim.get('lr_scaling', '?')}"),
        ("optimizer steps", str(final.get("step", "?"))),
    ]
    for key in ("train_loss", "val_loss", "val_accuracy") if not own else ("loss", "train_loss", "val_loss",
                                                                           "val_accuracy"):
        if isinstance(final.get(key), (int, float)):
            lines.append((f"final {key}", f"{final[key]:.4f}"))
    if best is not None:
        lines.append(("best val_accuracy", f"{best['val_accuracy']:.4f} (epoch {best['epoch']})"))
    if isinstance(final.get("samples_per_sec"), (int, float)):
        lines.append(("throughput (last epoch)", f"{final['samples_per_sec']:,.0f} samples/s"))
    if total_time or not own:  # your own loop records no epoch time
        lines.append(("training time", f"{total_time:,.1f} s"))
    return lines


def render_report(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the four plots and ``summary.png`` for ``run_dir``; return their paths."""
    data = load_run(run_dir)
    plt = _pyplot()
    out = Path(out_dir) if out_dir else data.run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in PLOTS:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        DRAWERS[name](ax, data)
        _finish(ax)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=DPI)
        plt.close(fig)
        written.append(path)

    fig = plt.figure(figsize=(8.27, 11.69))  # A4 portrait: one page
    grid = fig.add_gridspec(3, 2, height_ratios=[1.0, 1.0, 0.9], hspace=0.45, wspace=0.28)
    for i, name in enumerate(PLOTS):
        ax = fig.add_subplot(grid[i // 2, i % 2])
        DRAWERS[name](ax, data)
        _finish(ax)
    table = fig.add_subplot(grid[2, :])
    table.axis("off")
    rows = summary_lines(data)
    cells = table.table(cellText=[[k, v] for k, v in rows], loc="upper center",
                        cellLoc="left", colWidths=[0.3, 0.7])
    cells.auto_set_font_size(False)
    cells.set_fontsize(9)
    fig.suptitle(f"hvdtrain run: {data.config.get('recipe', '')} / {data.config.get('framework', '')} "
                 f"on {data.epochs[-1].get('world_size', data.config.get('workers', '?'))} worker(s)", fontsize=14)
    path = out / "summary.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    written.append(path)
    return written
