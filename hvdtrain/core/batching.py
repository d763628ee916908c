"""How an epoch's samples become micro-batches and updates, at the current world size.

Two ways, one :class:`BatchPlan` (built by :func:`plan_for`, used by the loop):

* **Per worker** (``train.global_batch_size`` unset, the default): each worker takes its shard of
  the epoch's order (:func:`hvdtrain.core.sharding.train_shard`) in batches of
  ``train.batch_size`` and sums ``train.grad_accumulation`` of them per update; the global batch is
  ``batch_size x workers x grad_accumulation`` and changes with the world size.
* **Fixed global batch** (``train.global_batch_size = G``): an update takes ``G`` samples whatever
  the world size. The epoch's order (:func:`~hvdtrain.core.sharding.epoch_order`) is padded
  (``data.remainder=pad``: its first samples again) or cut (``drop``) to a multiple of ``G`` and
  cut into global batches; update ``k`` of the epoch takes global batch ``k``, which is cut into
  ``M = G / train.batch_size`` micro-batches of ``train.batch_size`` samples, dealt to the workers
  in contiguous blocks: worker ``r`` computes micro-batches ``r*A .. r*A+A-1`` with ``A = M /
  workers`` (its accumulation). The samples of update ``k`` are therefore the same at any world
  size that divides ``M``; the others are refused before training, naming those that can
  (:func:`global_batch_refusal`). Where the user did not set ``train.batch_size`` (a recipe's
  default is not the user's: :func:`given`), the micro-batch follows from the global batch instead:
  ``b = G / (workers x train.grad_accumulation)`` (:func:`micro_batch`), one micro-batch per worker
  per update unless ``train.grad_accumulation`` is set, and rank 0 says so
  (:func:`derivation_note`). Bitwise mode (``train.reproducible=world-size``) and elastic jobs keep
  ``train.batch_size`` as it is: both need the same micro-batches at every world size. The LR schedule counts samples
  (:func:`hvdtrain.core.schedule.schedule_step`), and the peak LR is scaled by ``M`` (workers x
  accumulation), the same at any world size.

Positions stay as everywhere else: samples of the epoch's (padded) order consumed. A fixed global
batch's updates end at multiples of ``G``, where every checkpoint and elastic commit is taken, so an
elastic job that re-forms on another world size continues the same updates: at the re-form
:func:`reform_plan` re-derives the plan (each worker's share of the next update) or refuses a world
size that cannot share it, and :func:`note_world_size` / :func:`world_size_ranges` keep which world
size ran which updates (an epoch's ``metrics.jsonl`` row names them when there was more than one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hvdtrain.core import sharding
from hvdtrain.core.config import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """Micro-batches and updates of one world size (see the module docstring)."""

    micro_batch: int  # samples per micro-batch (train.batch_size)
    accumulation: int  # micro-batches per worker per update
    world_size: int  # data-parallel workers
    global_batch: int | None = None  # train.global_batch_size, None: per-worker batches
    summed: bool = False  # bitwise mode: the exchange sums every worker's micro-batch gradients (no average)

    @property
    def samples_per_update(self) -> int:
        """Samples one update averages over all workers."""
        return self.micro_batch * self.world_size * self.accumulation

    @property
    def micro_batches(self) -> int:
        """Micro-batches per update over all workers (``M``)."""
        return self.world_size * self.accumulation

    def weight(self, samples: int, window_samples: int) -> float:
        """The loss weight of a micro-batch of ``samples`` in a window of ``window_samples`` on this
        worker: its share of the worker's window (the exchange averages the workers), or in bitwise
        mode its share of the whole update (the exchange sums), the same number at any world size."""
        return samples / (window_samples * self.world_size) if self.summed else samples / window_samples

    def updates_per_epoch(self, num_samples: int, remainder: str) -> int:
        """Optimizer updates in one epoch of ``num_samples`` samples."""
        return self.steps(num_samples, remainder)[1]

    def steps(self, num_samples: int, remainder: str) -> tuple[int, int]:
        """(micro-batches per worker, updates) in one epoch of ``num_samples`` samples."""
        if self.global_batch is None:
            per_rank = sharding.shard_size(num_samples, self.world_size, remainder)
            micro = math.ceil(per_rank / self.micro_batch)
            return micro, math.ceil(micro / self.accumulation)
        updates = global_updates(num_samples, self.global_batch, remainder)
        return updates * self.accumulation, updates

    def epoch_batches(self, num_samples: int, rank: int, epoch: int, seed: int, shuffle: bool = True,
                      remainder: str = "pad", start: int = 0) -> list[np.ndarray]:
        """The micro-batches worker ``rank`` computes in ``epoch`` from position ``start`` (samples
        of the epoch's order already consumed), in order: ``accumulation`` of them per update."""
        if self.global_batch is None:
            indices = sharding.train_shard(num_samples, rank, self.world_size, epoch, seed, shuffle, remainder,
                                           start=start)
            return sharding.batches(indices, self.micro_batch)
        return [*deal(num_samples, self, rank, epoch, seed, shuffle, remainder, start)]


def global_updates(num_samples: int, global_batch: int, remainder: str) -> int:
    """Updates of ``global_batch`` samples in an epoch of ``num_samples``: the order padded up
    (``pad``) or cut down (``drop``) to a multiple of the global batch."""
    if remainder == "pad":
        return math.ceil(num_samples / global_batch)
    if remainder == "drop":
        return num_samples // global_batch
    raise ValueError(f"remainder {remainder!r} is not allowed; choose one of: pad, drop")


def global_order(num_samples: int, global_batch: int, epoch: int, seed: int, shuffle: bool = True,
                 remainder: str = "pad") -> np.ndarray:
    """The epoch's order padded or cut to whole global batches: update ``k`` takes
    ``[k * global_batch, (k + 1) * global_batch)`` of it, at any world size."""
    order = sharding.epoch_order(num_samples, epoch, seed, shuffle)
    total = global_updates(num_samples, global_batch, remainder) * global_batch
    return np.resize(order, total) if total > num_samples else order[:total]  # resize repeats from the start


def deal(num_samples: int, plan: BatchPlan, rank: int, epoch: int, seed: int, shuffle: bool = True,
         remainder: str = "pad", start: int = 0) -> list[np.ndarray]:
    """Worker ``rank``'s micro-batches of a fixed-global-batch epoch from position ``start`` (a
    multiple of the global batch): of each global batch, micro-batches ``rank * A .. rank * A + A - 1``."""
    assert plan.global_batch is not None
    g, b, a = plan.global_batch, plan.micro_batch, plan.accumulation
    if start % g:
        raise ValueError(f"position {start} is not at an update boundary of train.global_batch_size={g}")
    if not 0 <= rank < plan.world_size:
        raise ValueError(f"rank {rank} is outside 0..{plan.world_size - 1}")
    rest = global_order(num_samples, g, epoch, seed, shuffle, remainder)[start:]
    micro = rest.reshape(-1, plan.micro_batches, b)[:, rank * a:(rank + 1) * a]
    return [m for update in micro for m in update]


def micro_batch_index(plan: BatchPlan, rank: int, local: int) -> int:
    """The index (0 .. M-1) within its update of worker ``rank``'s ``local``-th micro-batch of an
    epoch: the same micro-batch has the same index at any world size."""
    return rank * plan.accumulation + local % plan.accumulation


def dividing_world_sizes(micro_batches: int) -> list[int]:
    """The world sizes that can share ``micro_batches`` micro-batches per update."""
    return [n for n in range(1, micro_batches + 1) if micro_batches % n == 0]


def given(train: Any, name: str) -> bool:
    """Whether the user set ``train.NAME``: the keys :func:`hvdtrain.core.resolve.load_config`
    recorded as given by the config file, the arguments and the overrides (``train.given_keys``; a
    recipe's defaults are not the user's), else, for a config built in code, a value that is not
    the default."""
    recorded = getattr(train, "__dict__", {}).get("given_keys")
    if recorded is not None:
        return name in recorded
    return getattr(train, name) != getattr(type(train)(), name)


def derives_micro_batch(train: Any) -> bool:
    """Whether ``train.batch_size`` follows from ``train.global_batch_size`` and the world size: a
    global batch, no ``train.batch_size`` of the user's, and neither bitwise mode nor an elastic job
    (both keep the same micro-batches at every world size, so ``train.batch_size`` as it is)."""
    return (train.global_batch_size is not None and not given(train, "batch_size")
            and getattr(train, "reproducible", "none") != "world-size" and not getattr(train, "elastic", False))


def micro_batch(train: Any, world_size: int) -> int:
    """The micro-batch on ``world_size`` workers: ``train.batch_size``, or where it follows from the
    global batch (:func:`derives_micro_batch`) ``global_batch_size / (world_size x
    grad_accumulation)`` (callers check it divides: :func:`global_batch_refusal`)."""
    if not derives_micro_batch(train):
        return train.batch_size
    return max(1, train.global_batch_size // (world_size * max(1, train.grad_accumulation)))


def derivation_note(train: Any, world_size: int) -> str | None:
    """Rank 0's note where the micro-batch followed from the global batch, else None."""
    if not derives_micro_batch(train):
        return None
    a = train.grad_accumulation
    per = f" x train.grad_accumulation={a}" if a != 1 else ""
    return (f"train.batch_size={micro_batch(train, world_size)} from train.global_batch_size="
            f"{train.global_batch_size} on {world_size} workers{per} (set train.batch_size to choose the "
            f"micro-batch; the workers then accumulate)")


def notes(train: Any, world_size: int) -> list[str]:
    """Rank 0's lines as a run on ``world_size`` workers begins (:func:`derivation_note`)."""
    note = derivation_note(train, world_size)
    return [f"hvdtrain: note: {note}"] if note else []


def config_refusal(train: Any) -> str | None:
    """Why ``train.global_batch_size`` cannot be cut into micro-batches of ``train.batch_size``, or
    an explicit ``train.grad_accumulation`` fits it at no world size (what needs no job)."""
    g, b, a = train.global_batch_size, train.batch_size, train.grad_accumulation
    if g is not None and derives_micro_batch(train):
        if a != 1 and g % a:
            return (f"train.grad_accumulation={a} contradicts train.global_batch_size={g}: {g} samples cannot be "
                    f"accumulated in {a} equal micro-batches; leave train.grad_accumulation unset, or set "
                    f"train.batch_size")
        return None
    if g is not None and g % b:
        return (f"train.global_batch_size={g} is not a multiple of train.batch_size={b} (the micro-batch one worker "
                f"computes at once); choose a global batch of whole micro-batches, or a batch_size that divides {g}")
    if g is not None and a != 1 and (g // b) % a:
        return (f"train.grad_accumulation={a} contradicts train.global_batch_size={g}: its {g // b} micro-batches of "
                f"train.batch_size={b} cannot be shared by workers accumulating {a} each; leave "
                f"train.grad_accumulation unset (it follows from the global batch and the world size)")
    return None


def global_batch_refusal(train: Any, world_size: int) -> str | None:
    """Why a fixed global batch cannot run on ``world_size`` workers (one line), or None."""
    problem = config_refusal(train)
    if problem or train.global_batch_size is None:
        return problem
    g, b = train.global_batch_size, train.batch_size
    if derives_micro_batch(train):
        a = train.grad_accumulation
        if g % (world_size * a):
            share = g // a
            sizes = ", ".join(map(str, dividing_world_sizes(share)))
            each = f" accumulating train.grad_accumulation={a} each" if a != 1 else ""
            return (f"train.global_batch_size={g} cannot be shared equally by {world_size} workers{each} (train."
                    f"batch_size follows from it, as it is not set); launch {sizes} workers (the world sizes that "
                    f"divide {share}), or set train.batch_size and let the workers accumulate")
        return None
    micro = g // b
    if micro % world_size:
        sizes = ", ".join(map(str, dividing_world_sizes(micro)))
        return (f"train.global_batch_size={g} is {micro} micro-batches of train.batch_size={b}, which {world_size} "
                f"workers cannot share equally; launch {sizes} workers (the world sizes that divide {micro}), or "
                f"change train.batch_size")
    accumulation = micro // world_size
    if train.grad_accumulation not in (1, accumulation):
        return (f"train.grad_accumulation={train.grad_accumulation} contradicts train.global_batch_size={g}: with "
                f"train.batch_size={b} on {world_size} workers an update accumulates {accumulation} micro-batches "
                f"per worker; leave train.grad_accumulation unset (it follows from the global batch)")
    return None


def plan_for(train: Any, world_size: int) -> BatchPlan:
    """The :class:`BatchPlan` of a :class:`~hvdtrain.core.config.TrainConfig` on ``world_size``
    data-parallel workers, or a ConfigError naming why it cannot run there."""
    if train.global_batch_size is None:
        return BatchPlan(train.batch_size, train.grad_accumulation, world_size)
    problem = global_batch_refusal(train, world_size)
    if problem:
        raise ConfigError(problem)
    b = micro_batch(train, world_size)
    micro = train.global_batch_size // b
    summed = getattr(train, "reproducible", "none") == "world-size"
    return BatchPlan(b, micro // world_size, world_size, train.global_batch_size, summed)


def as_run(config: Any, world_size: int) -> Any:
    """``config`` as the adapter runs it on ``world_size`` workers: with a fixed global batch, a
    copy whose ``train.grad_accumulation`` (and ``train.batch_size``, where it follows from the
    global batch) is the one that follows (the user's config, what ``config.yaml`` and
    ``--resume`` compare, stays as given)."""
    if config.train.global_batch_size is None:
        return config
    plan = plan_for(config.train, world_size)
    return replace(config, train=replace(config.train, grad_accumulation=plan.accumulation,
                                         batch_size=plan.micro_batch))


def may_reform(config: Any) -> bool:
    """Whether each worker's accumulation can change while the job runs: an elastic job with a
    fixed global batch (an adapter keeps its accumulation buffers even while it accumulates one)."""
    return bool(config.train.elastic and config.train.global_batch_size is not None)


def reform_plan(train: Any, world_size: int) -> BatchPlan:
    """The plan after an elastic job re-formed with ``world_size`` workers (a fixed global batch:
    each worker's new share of the same updates), or a ConfigError saying the job re-formed with a
    world size that cannot share it and naming those that can (the same line as at the start)."""
    try:
        return plan_for(train, world_size)
    except ConfigError as exc:
        raise ConfigError(f"train.elastic=true: the job re-formed with {world_size} workers: {exc}") from None


def note_world_size(changes: list[tuple[int, int]], first_update: int, world_size: int) -> list[tuple[int, int]]:
    """``changes`` (``(first update, world size)`` in order) once updates from ``first_update`` on
    run on ``world_size`` workers: later entries (updates rolled back) go, a new size is added."""
    kept = [(first, size) for first, size in changes if first < first_update]
    return kept if kept and kept[-1][1] == world_size else [*kept, (first_update, world_size)]


def world_size_ranges(changes: list[tuple[int, int]], first: int, last: int) -> list[list[int]]:
    """``[[first update, last update, world size], ...]`` of updates ``first .. last`` (1-based,
    inclusive) from ``changes`` (:func:`note_world_size`); updates before every change are left out."""
    ranges = []
    for i, (start, size) in enumerate(changes):
        end = changes[i + 1][0] - 1 if i + 1 < len(changes) else last
        lo, hi = max(start, first), min(end, last)
        if lo <= hi:
            ranges.append([lo, hi, size])
    return ranges


def world_sizes_field(changes: Any, history: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """``{"world_sizes": [[first, last, workers], ...]}`` for an epoch row ending at update ``step``
    (``history``: the rows before it) whose updates ran on more than one world size, else ``{}``."""
    first = history[-1]["step"] + 1 if history and "step" in history[-1] else 1
    ranges = world_size_ranges(list(changes or ()), first, step)
    return {"world_sizes": ranges} if len(ranges) > 1 else {}
