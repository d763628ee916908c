"""`hvdtrain bench`: a synthetic training benchmark in the spirit of Horovod's own.

A fixed random batch, a few warm-up steps, then timed iterations of several steps each, all
through hvdtrain's framework adapter (the same ``train_step``, gradient allreduce, compression and
communication options as a training run). Each rank records samples/s per iteration; the report
gives samples/s per worker (mean and 95% interval) and in total, and :func:`format_scaling`
turns runs at several world sizes into scaling efficiency. Framework-neutral: the model and the
batch come from ``hvdtrain.<framework>.bench``.
"""

from __future__ import annotations

import importlib
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from hvdtrain.core import rules
from hvdtrain.core.adapter import load_adapter

# Two-sided 95% quantiles of Student's t by degrees of freedom (1.96 beyond the table).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000}


@dataclass
class Summary:
    """Mean with its 95% confidence half-width, median and range of a sample."""

    n: int
    mean: float
    ci95: float
    median: float
    minimum: float
    maximum: float


def t_quantile(dof: int) -> float:
    """Two-sided 95% Student-t quantile for ``dof`` degrees of freedom (conservative between rows)."""
    if dof <= 0:
        return math.inf
    for row in sorted(_T975):
        if dof <= row:
            return _T975[row]
    return 1.96


def summarize(values: list[float]) -> Summary:
    """Summary of ``values``: the interval is mean +- t * s / sqrt(n) (infinite for one value)."""
    if not values:
        raise ValueError("cannot summarize an empty list of measurements")
    n = len(values)
    mean = statistics.fmean(values)
    ci = t_quantile(n - 1) * statistics.stdev(values) / math.sqrt(n) if n > 1 else math.inf
    return Summary(n, mean, ci, statistics.median(values), min(values), max(values))


def timed_iterations(step: Callable[[], Any], samples_per_step: int, warmup_steps: int, steps_per_iter: int,
                     iters: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Run ``step`` ``warmup_steps`` times, then ``iters`` timed groups of ``steps_per_iter``;
    return samples/s of each group."""
    for _ in range(warmup_steps):
        step()
    rates = []
    for _ in range(iters):
        started = clock()
        for _ in range(steps_per_iter):
            step()
        rates.append(samples_per_step * steps_per_iter / max(clock() - started, 1e-12))
    return rates


def scaling_efficiency(totals: dict[int, float]) -> dict[int, float]:
    """Efficiency of each world size: total throughput / (smallest run's per-worker x workers)."""
    base = min(totals)
    per_worker = totals[base] / base
    return {n: totals[n] / (per_worker * n) for n in sorted(totals)}


@dataclass
class BenchSettings:
    """What one benchmark measures (the rest comes from the RunConfig: model, batch, comm, ...)."""

    image_size: int = 224
    channels: int = 3
    warmup_batches: int = 10
    batches_per_iter: int = 10
    iters: int = 10


@dataclass
class BenchResult:
    """One benchmark run: settings, world size and every rank's samples/s per iteration."""

    framework: str
    model: str
    batch_size: int
    world_size: int
    settings: dict[str, Any]
    comm: dict[str, Any]
    fp16_allreduce: bool
    mixed_precision: str
    rank_rates: list[list[float]] = field(default_factory=list)

    @property
    def per_worker(self) -> Summary:
        """Samples/s of one worker: every rank's iterations pooled."""
        return summarize([r for rates in self.rank_rates for r in rates])

    @property
    def total(self) -> float:
        """Samples/s of the whole job: the sum of each rank's mean."""
        return sum(statistics.fmean(rates) for rates in self.rank_rates)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, with the summaries."""
        return {**asdict(self), "per_worker": asdict(self.per_worker), "total": self.total}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BenchResult":
        """Inverse of :meth:`to_dict`."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def framework_bench(framework: str) -> Any:
    """``hvdtrain.<framework>.bench``: ``synthetic_task(config, settings)`` (a TrainTask whose
    train_data is one fixed random batch, an ArrayDataset) and ``to_device(adapter, x, y)``."""
    return importlib.import_module(f"hvdtrain.{framework}.bench")


def run_bench(config: Any, settings: BenchSettings) -> tuple[BenchResult, int]:
    """Benchmark ``config`` (framework, model, batch, comm options) in this process; under a
    launcher every worker calls this and every worker gets the whole result and its own rank."""
    adapter = load_adapter(config.framework)
    ctx = adapter.init(config)
    rules.check_job(config, ctx)  # refused here as in training (Adasum on Gloo, fp16 without a GPU, ...)
    module = framework_bench(config.framework)
    task = module.synthetic_task(config, settings)
    adapter.prepare(task, config)
    adapter.broadcast_state(root_rank=0)
    adapter.set_learning_rate(config.optim.lr)
    inputs, targets = module.to_device(adapter, task.train_data.inputs, task.train_data.targets)
    # float(): wait for the step (train_step returns the loss on the device, without a host sync)
    rates = timed_iterations(lambda: float(adapter.train_step(inputs, targets)), config.train.batch_size,
                             settings.warmup_batches, settings.batches_per_iter, settings.iters)
    result = BenchResult(config.framework, config.model.name, config.train.batch_size, ctx.size, asdict(settings),
                         asdict(config.comm), config.train.fp16_allreduce, config.train.mixed_precision,
                         adapter.allgather_object(rates))
    return result, ctx.rank


def format_result(result: BenchResult) -> str:
    """Horovod-style report: samples/s per worker and in total."""
    w, s = result.per_worker, result.settings
    extras = ["fp16 allreduce" if result.fp16_allreduce else "",
              f"mixed precision {result.mixed_precision}" if result.mixed_precision != "none" else "",
              "Adasum" if result.comm.get("reduction") == "adasum" else ""]
    lines = [
        f"Model: {result.model} ({result.framework}), batch size {result.batch_size} per worker, "
        f"{s['image_size']}x{s['image_size']}x{s['channels']} images"
        + "".join(f", {e}" for e in extras if e),
        f"Workers: {result.world_size}; {s['warmup_batches']} warm-up batches, {s['iters']} iterations of "
        f"{s['batches_per_iter']} batches",
        f"Samples/s per worker: {w.mean:.1f} +-{w.ci95:.1f} (mean and 95% interval over {w.n} iterations)",
        f"Total samples/s on {result.world_size} worker(s): {result.total:.1f} +-{w.ci95 * result.world_size:.1f}",
    ]
    return "\n".join(lines)


def format_scaling(results: list[BenchResult]) -> str:
    """A table of runs at several world sizes with their scaling efficiency."""
    totals = {r.world_size: r.total for r in results}
    efficiency = scaling_efficiency(totals)
    lines = [f"{'workers':>7}  {'samples/s per worker':>22}  {'total samples/s':>15}  {'scaling efficiency':>18}"]
    for r in sorted(results, key=lambda r: r.world_size):
        w = r.per_worker
        lines.append(f"{r.world_size:>7}  {f'{w.mean:.1f} +-{w.ci95:.1f}':>22}  {r.total:>15.1f}  "
                     f"{efficiency[r.world_size]:>17.1%}")
    return "\n".join(lines)
