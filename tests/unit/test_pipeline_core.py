"""The framework-neutral pipeline pieces: layout, process sets, GPipe ticks, cuts, refusals."""

from __future__ import annotations

import itertools

import pytest

from hvdtrain.core import pipeline
from hvdtrain.core import config as _config
from hvdtrain.core import rules
from hvdtrain.core.config import ConfigError
from hvdtrain.core.resolve import load_config


def test_layout_maps_every_rank_to_one_stage_and_replica():
    layout = pipeline.Layout.for_world(8, 2)
    assert (layout.stages, layout.replicas) == (2, 4)
    seen = {(layout.stage_of(r), layout.replica_of(r)) for r in range(8)}
    assert len(seen) == 8
    for r in range(8):
        assert layout.rank_of(layout.stage_of(r), layout.replica_of(r)) == r
    assert layout.replica_ranks(1) == [2, 3]  # a replica's stages are neighbouring ranks
    assert layout.stage_ranks(1) == [1, 3, 5, 7]


def test_process_sets_are_distinct_and_skip_the_world_and_single_ranks():
    assert pipeline.Layout.for_world(4, 2).process_sets() == [[0, 2], [1, 3], [0, 1], [2, 3]]
    assert pipeline.Layout.for_world(2, 2).process_sets() == []  # one replica: the global set; stage sets: 1 rank
    sets = pipeline.Layout.for_world(12, 3).process_sets()
    assert len(sets) == 3 + 4 and all(len(s) > 1 for s in sets)


def test_world_size_must_divide_by_the_stages():
    with pytest.raises(ConfigError, match=r"pipeline_stages=3 does not divide the world size 4"):
        pipeline.Layout.for_world(4, 3)


@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 4), (3, 8), (4, 2)])
def test_gpipe_ticks_run_every_micro_batch_once_in_order(stages, micro):
    fwd, bwd = pipeline.forward_ticks(stages, micro), pipeline.backward_ticks(stages, micro)
    assert len(fwd) == len(bwd) == micro + stages - 1
    for s in range(stages):
        assert [row[s] for row in fwd if row[s] is not None] == list(range(micro))
        assert [row[s] for row in bwd if row[s] is not None] == list(range(micro))[::-1]
    for table, step in ((fwd, -1), (bwd, 1)):  # a stage's input was produced one tick earlier
        where = {(row[s], s): t for t, row in enumerate(table) for s in range(stages) if row[s] is not None}
        for (m, s), t in where.items():
            source = s + step
            if 0 <= source < stages:
                assert where[(m, source)] == t - 1
    idle = sum(row[0] is None for row in fwd) / len(fwd)
    assert idle == pytest.approx(pipeline.bubble_fraction(stages, micro))


def test_bubble_fraction():
    assert pipeline.bubble_fraction(2, 1) == 0.5
    assert pipeline.bubble_fraction(2, 4) == pytest.approx(0.2)
    assert pipeline.bubble_fraction(2, 8) == pytest.approx(1 / 9)


def test_split_sizes_cover_the_batch():
    assert pipeline.split_sizes(10, 4) == [3, 3, 2, 2]
    assert pipeline.split_sizes(3, 4) == [1, 1, 1]
    assert sum(pipeline.split_sizes(64, 8)) == 64


def brute_force(costs, stages):
    n = len(costs)
    best = None
    for bounds in itertools.combinations(range(1, n), stages - 1):
        edges = [0, *bounds, n]
        worst = max(sum(costs[a:b]) for a, b in zip(edges, edges[1:]))
        if best is None or worst < best:
            best = worst
    return best


@pytest.mark.parametrize("costs,stages", [([1, 1, 1, 1], 2), ([9, 1, 1, 1, 1, 1], 2), ([1, 2, 3, 4, 5, 6, 7], 3),
                                          ([5, 1, 8, 2, 2, 9, 1], 4), ([3, 3], 2)])
def test_balanced_cut_is_optimal(costs, stages):
    bounds = pipeline.balanced_cut(costs, stages)
    assert len(bounds) == stages - 1 and bounds == sorted(set(bounds)) and 0 < bounds[0] and bounds[-1] < len(costs)
    edges = [0, *bounds, len(costs)]
    assert max(sum(costs[a:b]) for a, b in zip(edges, edges[1:])) == brute_force(costs, stages)


def test_manual_cut_and_its_errors():
    assert pipeline.resolve_cut([2], [1, 1, 1, 1], 2) == [2]
    assert pipeline.resolve_cut("1,3", [1, 1, 1, 1], 3) == [1, 3]
    with pytest.raises(ConfigError, match=r"parallel.cut: \[4\] does not cut 4 blocks into 2"):
        pipeline.resolve_cut([4], [1, 1, 1, 1], 2)
    with pytest.raises(ConfigError, match=r"parallel.cut: \[2, 1\]"):
        pipeline.resolve_cut([2, 1], [1, 1, 1, 1], 3)
    with pytest.raises(ConfigError, match=r"parallel.cut: 'halves' is not allowed"):
        pipeline.resolve_cut("halves", [1, 1], 2)


def test_fewer_blocks_than_stages_is_refused():
    with pytest.raises(ConfigError, match=r"only 2 blocks, fewer than the 3 stages"):
        pipeline.resolve_cut("balanced", [1, 1], 3)


def test_stage_blocks():
    assert list(pipeline.stage_blocks([3, 5], 7, 0)) == [0, 1, 2]
    assert list(pipeline.stage_blocks([3, 5], 7, 2)) == [5, 6]


@pytest.mark.parametrize("override,world,reason", [
    ("train.elastic=true", 4, "train.elastic=true"),
    (None, 6, "does not divide the world size 6"),
    ("train.grad_accumulation=2", 4, "train.grad_accumulation=2 is not supported"),
    ("comm.reduction=adasum", 4, "comm.reduction='adasum' is not supported"),
    ("train.mixed_precision=fp16", 4, "train.mixed_precision=fp16 is not supported"),
    ("parallel.micro_batches=128", 4, "parallel.micro_batches=128 is more than train.batch_size=64"),
])
def test_refusals_name_the_reason(override, world, reason):
    overrides = ["parallel.pipeline_stages=4" if world == 6 else "parallel.pipeline_stages=2",
                 *([override] if override else [])]
    config = _config.load_config(overrides=overrides)  # the sections' own checks only
    assert reason in rules.refusal(config, rules.World(world, mpi=True, gpu=True))
    with pytest.raises(ConfigError, match="parallel.pipeline_stages|not supported|more than"):
        rules.check(config, rules.World(world, mpi=True, gpu=True))


def test_supported_config_gives_the_layout():
    config = load_config(overrides=["parallel.pipeline_stages=2", "parallel.micro_batches=4"])
    assert rules.refusal(config, rules.World(4)) is None
    assert pipeline.Layout.for_world(4, 2) == pipeline.Layout(2, 2)
    assert rules.refusal(load_config(), rules.World(3)) is None  # one stage: nothing to refuse


def test_bad_cut_is_a_config_error():
    with pytest.raises(ConfigError, match="parallel.cut"):
        load_config(overrides=["parallel.cut=evenly"])
    assert load_config(overrides=["parallel.cut=[2]"]).parallel.cut == [2]
