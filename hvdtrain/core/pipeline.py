"""Pipeline parallelism, the framework-neutral part: layout, cut, schedule (what may not run
pipelined is in :mod:`hvdtrain.core.rules`).

With ``parallel.pipeline_stages = S`` the model's ordered blocks are cut into S consecutive
stages and the N ranks form an S x R grid (R = N / S data-parallel replicas)::

    rank = replica * S + stage        (a replica's stages are neighbouring ranks: the same host)

Each stage's gradients are averaged over the R ranks that hold it (one Horovod process set per
stage); activations travel forward and their gradients backward between the S ranks of one
replica (one process set per replica). Each replica's batch is split into ``micro_batches = M``
micro-batches run in a GPipe fill-and-drain schedule of ``M + S - 1`` synchronous ticks forward
and as many backward; a stage idles in ``S - 1`` of them (the bubble).

The schedule itself runs in :mod:`hvdtrain.core.gpipe`, over each framework's stage primitives
(:mod:`hvdtrain.torch.stage`, :mod:`hvdtrain.tensorflow.stage`). Nothing here imports torch or
TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from hvdtrain.core.config import ConfigError, parse_cut
from hvdtrain.core.rules import task_refusal

_PROCESS_SETS: dict[tuple[str, tuple[int, ...]], Any] = {}  # added in this process, by (Horovod module, ranks)


@dataclass(frozen=True)
class Layout:
    """S stages x R replicas over ``stages * replicas`` ranks; ``rank = replica * stages + stage``."""

    stages: int
    replicas: int

    @classmethod
    def for_world(cls, world_size: int, stages: int) -> "Layout":
        """The layout of ``world_size`` ranks into ``stages`` stages, or a ConfigError naming why not."""
        if stages < 1:
            raise ConfigError(f"parallel.pipeline_stages: {stages} is out of range; it must be >= 1")
        if world_size % stages:
            raise ConfigError(f"parallel.pipeline_stages={stages} does not divide the world size {world_size}; "
                              f"launch a multiple of {stages} workers or choose a divisor of {world_size}")
        return cls(stages, world_size // stages)

    @property
    def world_size(self) -> int:
        """Ranks in the layout."""
        return self.stages * self.replicas

    def stage_of(self, rank: int) -> int:
        """The pipeline stage ``rank`` runs."""
        return rank % self.stages

    def replica_of(self, rank: int) -> int:
        """The data-parallel replica ``rank`` belongs to (its data shard)."""
        return rank // self.stages

    def rank_of(self, stage: int, replica: int) -> int:
        """The rank running ``stage`` of ``replica``."""
        return replica * self.stages + stage

    def stage_ranks(self, stage: int) -> list[int]:
        """Ranks holding ``stage``: its gradients are averaged over these (one process set)."""
        return [self.rank_of(stage, r) for r in range(self.replicas)]

    def replica_ranks(self, replica: int) -> list[int]:
        """Ranks of one replica, stage order: activations pass between these (one process set)."""
        return [self.rank_of(s, replica) for s in range(self.stages)]

    def process_sets(self) -> list[list[int]]:
        """Every distinct rank list Horovod needs as a process set (the same list on every rank);
        a list equal to the whole world (Horovod's global set) or of one rank (nothing to
        exchange) is left out."""
        sets = [self.stage_ranks(s) for s in range(self.stages)] + \
               [self.replica_ranks(r) for r in range(self.replicas)]
        out: list[list[int]] = []
        for ranks in sets:
            if 1 < len(ranks) < self.world_size and ranks not in out:
                out.append(ranks)
        return out

    def open_process_sets(self, hvd: Any, rank: int) -> tuple[Any, Any]:
        """Horovod process sets for ``rank``: (its stage's set, its replica's set).

        ``hvd`` is the framework's Horovod module (``horovod.torch`` or ``horovod.tensorflow``),
        initialised with ``HOROVOD_DYNAMIC_PROCESS_SETS=1``. Every rank adds every set, in the same
        order (adding is a collective); a set already added in this process (a second adapter) is
        reused, since Horovod refuses to add the same ranks twice. A set equal to the whole world is
        Horovod's global set; a one-rank set is ``None`` (nothing to exchange)."""
        for ranks in self.process_sets():
            if (hvd.__name__, tuple(ranks)) not in _PROCESS_SETS:
                _PROCESS_SETS[hvd.__name__, tuple(ranks)] = hvd.add_process_set(ranks)
        world = tuple(range(self.world_size))

        def process_set(ranks: list[int]) -> Any:
            return hvd.global_process_set if tuple(ranks) == world else _PROCESS_SETS.get((hvd.__name__, tuple(ranks)))

        return (process_set(self.stage_ranks(self.stage_of(rank))),
                process_set(self.replica_ranks(self.replica_of(rank))))


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's idle fraction of each stage: ``(S - 1) / (M + S - 1)``."""
    return (stages - 1) / (micro_batches + stages - 1)


def forward_ticks(stages: int, micro_batches: int) -> list[list[int | None]]:
    """GPipe fill: at tick ``t`` stage ``s`` runs the forward of micro-batch ``t - s`` (None: idle).
    Returns one row per tick, one entry per stage."""
    return [[t - s if 0 <= t - s < micro_batches else None for s in range(stages)]
            for t in range(micro_batches + stages - 1)]


def backward_ticks(stages: int, micro_batches: int) -> list[list[int | None]]:
    """GPipe drain: the last stage starts with the last micro-batch; stage ``s`` runs the backward
    of micro-batch ``M - 1 - (t - (S - 1 - s))`` at tick ``t`` (None: idle)."""
    rows = []
    for t in range(micro_batches + stages - 1):
        row: list[int | None] = []
        for s in range(stages):
            k = t - (stages - 1 - s)
            row.append(micro_batches - 1 - k if 0 <= k < micro_batches else None)
        rows.append(row)
    return rows


def split_sizes(batch: int, micro_batches: int) -> list[int]:
    """Sizes of the micro-batches of a batch of ``batch`` samples (the first ones one larger when
    it does not divide); micro-batches left empty by a short last batch are dropped."""
    base, extra = divmod(batch, micro_batches)
    return [n for n in (base + (i < extra) for i in range(micro_batches)) if n > 0]


def balanced_cut(costs: Sequence[float], stages: int) -> list[int]:
    """Boundaries ``[b1, ..., b_{S-1}]`` cutting consecutive blocks with ``costs`` into ``stages``
    non-empty stages so that the most expensive stage is as cheap as possible (exact, by dynamic
    programming; ties keep earlier boundaries)."""
    n = len(costs)
    if n < stages:
        raise ConfigError(f"parallel.pipeline_stages={stages}: the model has only {n} blocks to cut")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # best[k][i]: the cheapest maximum over the first i blocks cut into k stages; cut[k][i]: last boundary
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    bounds, i = [], n
    for k in range(stages, 1, -1):
        i = cut[k][i]
        bounds.append(i)
    return sorted(bounds)


def resolve_cut(cut: Any, costs: Sequence[float], stages: int) -> list[int]:
    """The S-1 boundaries for ``parallel.cut`` over blocks with ``costs`` (a manual list is checked:
    S-1 strictly increasing boundaries inside ``1 .. len(costs) - 1``)."""
    n = len(costs)
    if n < stages:
        raise ConfigError(f"parallel.pipeline_stages={stages}: the model has only {n} blocks, fewer than "
                          f"the {stages} stages; use at most {n} stages")
    parsed = parse_cut(cut)
    if parsed == "balanced":
        return balanced_cut(costs, stages)
    bounds = list(parsed)
    if len(bounds) != stages - 1 or any(b <= a for a, b in zip([0, *bounds], [*bounds, n])):
        raise ConfigError(f"parallel.cut: {bounds} does not cut {n} blocks into {stages} non-empty stages; give "
                          f"{stages - 1} increasing boundaries between 1 and {n - 1}, or 'balanced'")
    return bounds


def stage_blocks(bounds: Sequence[int], n_blocks: int, stage: int) -> range:
    """Indices of the blocks ``stage`` runs."""
    edges = [0, *bounds, n_blocks]
    return range(edges[stage], edges[stage + 1])


def model_blocks(task: Any, config: Any) -> list[Any]:
    """The recipe's model as its ordered blocks (``TrainTask.pipeline_blocks()``), or the
    rulebook's refusal (:func:`hvdtrain.core.rules.task_refusal`) as a ConfigError: found out
    before training, not after."""
    problem = task_refusal(task, config)
    if problem:
        raise ConfigError(problem)
    return list(task.pipeline_blocks())


def tensor_owners(bounds: Sequence[int], blocks: Sequence[Any], stages: int,
                  tensors: Callable[[Any], Any]) -> dict[int, int]:
    """The stage owning each tensor the blocks hold, by ``id``; ``tensors(block)`` lists a block's
    tensors (framework variables or parameters). A tensor two blocks share belongs to the earlier stage."""
    owner: dict[int, int] = {}
    for s in range(stages):
        for b in stage_blocks(bounds, len(blocks), s):
            for t in tensors(blocks[b]):
                owner.setdefault(id(t), s)
    return owner
