"""Evaluation: the validation metrics of one model, the same on every rank.

Before evaluating, the model's running statistics (BatchNorm) are averaged over the ranks, so every
rank evaluates the model rank 0 saves. Each rank evaluates its share of the validation set
(:func:`~hvdtrain.core.sharding.eval_shard`: every sample counted once), rank 0 names the metric
keys, and one allreduce of the sums gives every rank the same metrics: every rank then takes the
same decisions from them (early stopping, the best checkpoint) without a collective of its own.
"""

from __future__ import annotations

from typing import Any

from hvdtrain.core import reproducible, sharding
from hvdtrain.core.prefetch import load_batches


def evaluate(task: Any, adapter: Any, ctx: Any, config: Any, watchdog: Any) -> dict[str, float]:
    """Validation metrics of ``task``'s model over the whole validation set (a sequence of
    collectives: every rank calls it at the same point): ``loss`` and the recipe's
    ``finalize_metrics`` of the summed ``eval_step`` values."""
    data = task.val_data
    adapter.sync_model_buffers()  # distributed: evaluate the model rank 0 saves, on every rank
    exact = reproducible.enabled(config)
    if exact:  # bitwise mode: the same batches at any world size
        batches = reproducible.eval_batches(len(data), ctx.data_rank, ctx.data_size, config.train.batch_size)
    else:
        indices = sharding.eval_shard(len(data), ctx.data_rank, ctx.data_size)
        batches = sharding.batches(indices, config.train.batch_size)
    sums: dict[str, float] = {}
    for inputs, targets in load_batches(data, batches, -1, config, ctx, convert=adapter.convert_batch):
        watchdog.beat(watchdog.step, "evaluating")
        for k, v in adapter.eval_step(inputs, targets).items():
            sums[k] = sums.get(k, 0.0) + (float(v) if exact else v)  # bitwise mode: in float64
    watchdog.beat(watchdog.step, "waiting in collectives (evaluation metrics)")
    keys = adapter.broadcast_object(sorted(sums) if ctx.is_main else None)
    totals = adapter.allreduce_sums({k: sums.get(k, 0.0) for k in keys})
    return {"loss": totals["loss_sum"] / max(1.0, totals["count"]), **task.finalize_metrics(totals)}
