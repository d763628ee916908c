"""issue 42, item 3: bitwise mode's plan (:mod:`hvdtrain.core.reproducible`) without a job: the
fixed tree, the partial sums that equal it, the keyed seeds, the validation batches, and the
rulebook's refusals naming both keys."""

import numpy as np
import pytest

from hvdtrain.core import reproducible, rules
from hvdtrain.core.config import RunConfig


def sequential(values):
    total = np.float32(0)
    for v in values:
        total = np.float32(total + v)
    return total


def leaves(m):
    """Float32 values (wide exponents) whose sequential sum and tree sum differ."""
    for seed in range(1000):
        rng = np.random.default_rng(seed)
        values = [np.float32(v) for v in rng.normal(size=m) * 10.0 ** rng.integers(-6, 6, size=m)]
        if sequential(values) != reproducible.tree_sum(values, np.add):
            return values
    raise AssertionError("no order-dependent values found")


def test_the_tree_splits_at_the_largest_power_of_two_below():
    assert [reproducible.split(n) for n in (2, 3, 4, 5, 8, 12)] == [1, 2, 2, 4, 4, 8]
    assert reproducible.tree_sum(list("abcde"), lambda a, b: f"({a}{b})") == "(((ab)(cd))e)"


@pytest.mark.parametrize("m", [8, 12, 16, 24])
def test_workers_partial_sums_of_power_of_two_blocks_give_the_tree_sum_bit_for_bit(m):
    values = leaves(m)
    whole = reproducible.tree_sum(values, np.add)
    assert sequential(values) != whole  # the order matters for these values: the test can fail
    for workers in (w for w in range(1, m + 1) if m % w == 0):
        block = m // workers
        if not reproducible.blocks_are_nodes(block):
            continue
        partials = [reproducible.tree_sum(values[r * block:(r + 1) * block], np.add) for r in range(workers)]
        assert reproducible.tree_sum(partials, np.add) == whole, (m, workers)


def test_blocks_that_are_not_nodes_send_every_micro_batch():
    assert [reproducible.blocks_are_nodes(a) for a in (1, 2, 3, 4, 6, 8)] == [True, True, False, True, False, True]


def test_seeds_are_keyed_by_seed_update_and_micro_batch_not_rank():
    seeds = {reproducible.micro_seed(42, u, j) for u in range(4) for j in range(8)}
    assert len(seeds) == 32 and all(0 <= s < 2**31 for s in seeds)
    assert reproducible.micro_seed(42, 3, 5) == reproducible.micro_seed(42, 3, 5) != reproducible.micro_seed(43, 3, 5)


def test_validation_batches_are_the_same_at_any_world_size():
    def batches(world):
        out = {}
        for rank in range(world):
            for j, b in enumerate(reproducible.eval_batches(22, rank, world, 4)):
                out[rank + j * world] = b.tolist()
        return [out[k] for k in sorted(out)]
    assert batches(1) == batches(2) == batches(4)
    assert batches(1)[-1] == [20, 21]


def bitwise(**keys):
    cfg = RunConfig()
    cfg.train.reproducible, cfg.train.global_batch_size, cfg.train.batch_size = "world-size", 16, 4
    for dotted, value in keys.items():
        section, key = dotted.split("__")
        setattr(getattr(cfg, section), key, value)
    return cfg


@pytest.mark.parametrize("keys, other", [
    ({"comm__compression": "powersgd"}, "comm.compression=powersgd"),
    ({"parallel__shard_optimizer": "gradients"}, "parallel.shard_optimizer=gradients"),
    ({"parallel__pipeline_stages": 2}, "parallel.pipeline_stages=2"),
    ({"train__global_batch_size": None}, "train.global_batch_size"),
    ({"comm__reduction": "adasum"}, "comm.reduction=adasum"),
    ({"comm__local_sgd_steps": 4}, "comm.local_sgd_steps=4"),
])
def test_what_does_not_keep_the_guarantee_is_refused_naming_both_keys(keys, other):
    problem = rules.refusal(bitwise(**keys))
    assert problem.startswith("train.reproducible=world-size cannot be combined with ") and other in problem, problem
    assert "\n" not in problem


def test_bitwise_mode_with_a_fixed_global_batch_is_allowed():
    assert rules.refusal(bitwise()) is None
    assert rules.refusal(bitwise(), rules.World(size=4)) is None
