"""issue 42, item 1: a fixed global batch (``train.global_batch_size``): the arithmetic, the
dealing of each update's micro-batches to the workers, and the refusals (no job needed)."""

import numpy as np
import pytest

from hvdtrain.core import batching, rules
from hvdtrain.core.config import ConfigError, RunConfig
from hvdtrain.core.schedule import build_schedule, schedule_step


def config(**train):
    cfg = RunConfig()
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def updates(plan_by_rank, num_samples, epoch=0, start=0, remainder="pad"):
    """Each update's samples, the workers' micro-batches concatenated in rank order."""
    per_rank = [p.epoch_batches(num_samples, r, epoch, seed=3, remainder=remainder, start=start)
                for r, p in enumerate(plan_by_rank)]
    a = plan_by_rank[0].accumulation
    out = []
    for k in range(len(per_rank[0]) // a):
        out.append(np.concatenate([m for rank in per_rank for m in rank[k * a:(k + 1) * a]]))
    return out


def test_accumulation_follows_from_the_global_batch_and_world_size():
    train = config(global_batch_size=32, batch_size=4).train
    for world, accumulation in ((1, 8), (2, 4), (4, 2), (8, 1)):
        plan = batching.plan_for(train, world)
        assert (plan.accumulation, plan.micro_batches, plan.samples_per_update) == (accumulation, 8, 32)
    plain = batching.plan_for(config(batch_size=4, grad_accumulation=2).train, 3)
    assert (plain.accumulation, plain.samples_per_update, plain.global_batch) == (2, 24, None)


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_update_k_takes_the_same_samples_at_any_world_size(remainder):
    train = config(global_batch_size=16, batch_size=2).train
    n = 70  # not a multiple of the global batch: pad repeats the first samples, drop leaves the last out
    by_world = {w: updates([batching.plan_for(train, w)] * w, n, epoch=1, remainder=remainder) for w in (1, 2, 4, 8)}
    order = batching.global_order(n, 16, 1, 3, remainder=remainder)
    expected = [order[k * 16:(k + 1) * 16] for k in range(len(order) // 16)]
    assert len(expected) == (5 if remainder == "pad" else 4)
    for world, got in by_world.items():
        assert [u.tolist() for u in got] == [e.tolist() for e in expected], world
    seen = np.concatenate(expected)
    if remainder == "drop":
        assert len(set(seen.tolist())) == len(seen) == 64
    else:
        assert set(seen.tolist()) == set(range(n))


def test_workers_take_contiguous_blocks_of_micro_batches():
    plan = batching.plan_for(config(global_batch_size=8, batch_size=1).train, 4)
    order = batching.global_order(16, 8, 0, 3)
    rank1 = plan.epoch_batches(16, 1, 0, seed=3)
    assert [int(m[0]) for m in rank1] == [order[2], order[3], order[10], order[11]]
    assert [batching.micro_batch_index(plan, 1, i) for i in range(4)] == [2, 3, 2, 3]


def test_a_resume_on_another_world_size_continues_the_same_updates():
    train = config(global_batch_size=8, batch_size=2).train
    full = updates([batching.plan_for(train, 4)] * 4, 40)
    resumed = updates([batching.plan_for(train, 2)] * 2, 40, start=16)  # after two updates, on 2 workers
    assert [u.tolist() for u in resumed] == [u.tolist() for u in full[2:]]
    with pytest.raises(ValueError, match="update boundary"):
        batching.plan_for(train, 2).epoch_batches(40, 0, 0, seed=3, start=6)


def test_a_world_size_that_cannot_share_the_micro_batches_is_refused_naming_those_that_can():
    cfg = config(global_batch_size=24, batch_size=4)
    problem = rules.refusal(cfg, rules.World(size=4))
    assert problem == ("train.global_batch_size=24 is 6 micro-batches of train.batch_size=4, which 4 workers cannot "
                       "share equally; launch 1, 2, 3, 6 workers (the world sizes that divide 6), or change "
                       "train.batch_size")
    assert "\n" not in problem
    assert rules.refusal(cfg, rules.World(size=3)) is None
    with pytest.raises(ConfigError, match="4 workers cannot share"):
        batching.plan_for(cfg.train, 4)


def test_a_contradicting_accumulation_is_refused_naming_both_keys():
    cfg = config(global_batch_size=32, batch_size=4, grad_accumulation=2)  # right for 4 workers, not for 2
    problem = rules.refusal(cfg, rules.World(size=2))
    assert "train.grad_accumulation=2" in problem and "train.global_batch_size=32" in problem
    assert "accumulates 4 micro-batches" in problem
    assert rules.refusal(config(global_batch_size=32, batch_size=4, grad_accumulation=4), rules.World(size=2)) is None


def test_a_global_batch_of_partial_micro_batches_is_refused_before_the_job():
    problem = rules.refusal(config(global_batch_size=30, batch_size=4))
    assert problem.startswith("train.global_batch_size=30 is not a multiple of train.batch_size=4")
    problem = rules.refusal(config(global_batch_size=32, batch_size=4, grad_accumulation=3))  # fits no world size
    assert problem.startswith("train.grad_accumulation=3 contradicts train.global_batch_size=32")
    assert rules.refusal(config(global_batch_size=32, batch_size=4, grad_accumulation=2)) is None


def test_the_adapter_runs_the_following_accumulation_and_the_user_config_stays():
    cfg = config(global_batch_size=32, batch_size=4)
    ran = batching.as_run(cfg, 2)
    assert ran.train.grad_accumulation == 4 and cfg.train.grad_accumulation == 1
    assert batching.as_run(config(batch_size=4), 2).train.grad_accumulation == 1


def test_the_lr_schedule_counts_samples_the_same_at_any_world_size():
    train = config(global_batch_size=32, batch_size=4).train
    optim = RunConfig().optim
    optim.warmup_epochs = 1.0
    lrs = {}
    for world in (1, 2, 4):
        plan = batching.plan_for(train, world)
        steps = plan.updates_per_epoch(100, "pad")
        schedule = build_schedule(optim, world, steps, 3, plan.accumulation)
        lrs[world] = [schedule(schedule_step(e, k * 32, plan.samples_per_update, steps))
                      for e in range(3) for k in range(steps)]
    assert lrs[1] == lrs[2] == lrs[4]
    assert len(set(lrs[1])) > 3  # warmup and decay: the witness is not a constant


def test_an_elastic_re_form_re_deals_the_same_updates_4_then_2_then_4_workers():
    """Item 2: an elastic job re-formed at an update boundary takes the same samples per update
    with its new share (4 workers for two updates, 2 for two, 4 again): the updates of a 4-worker run."""
    train = config(global_batch_size=8, batch_size=2, elastic=True).train
    full = updates([batching.plan_for(train, 4)] * 4, 48)
    plans = [batching.reform_plan(train, n) for n in (4, 2, 4)]
    assert [p.accumulation for p in plans] == [1, 2, 1]
    taken = [u for i, p in enumerate(plans) for u in updates([p] * p.world_size, 48, start=16 * i)[:2]]
    assert [u.tolist() for u in taken] == [u.tolist() for u in full]


def test_an_elastic_re_form_on_a_world_size_that_cannot_share_stops_naming_those_that_can():
    train = config(global_batch_size=16, batch_size=4, elastic=True).train
    with pytest.raises(ConfigError) as refused:
        batching.reform_plan(train, 3)
    assert str(refused.value) == (
        "train.elastic=true: the job re-formed with 3 workers: train.global_batch_size=16 is 4 micro-batches of "
        "train.batch_size=4, which 3 workers cannot share equally; launch 1, 2, 4 workers (the world sizes that "
        "divide 4), or change train.batch_size")
    assert rules.refusal(config(global_batch_size=16, batch_size=4, elastic=True)) is None  # no longer refused
    assert batching.may_reform(config(global_batch_size=16, elastic=True))
    assert not batching.may_reform(config(elastic=True)) and not batching.may_reform(config(global_batch_size=16))


def test_the_world_size_of_each_range_of_updates():
    changes = batching.note_world_size([], 1, 4)
    changes = batching.note_world_size(changes, 11, 2)  # re-formed on 2 workers after update 10
    changes = batching.note_world_size(changes, 11, 2)  # a sync on the same workers changes nothing
    changes = batching.note_world_size(changes, 17, 4)  # back to 4 after update 16
    assert changes == [(1, 4), (11, 2), (17, 4)]
    assert batching.world_size_ranges(changes, 7, 24) == [[7, 10, 4], [11, 16, 2], [17, 24, 4]]
    assert batching.world_size_ranges(changes, 17, 24) == [[17, 24, 4]]
    assert batching.note_world_size(changes, 15, 2) == [(1, 4), (11, 2)]  # rolled back before update 17
    assert batching.world_sizes_field(changes, [{"epoch": 1, "step": 6}], 12) == {
        "world_sizes": [[7, 10, 4], [11, 12, 2]]}
    assert batching.world_sizes_field(changes, [{"epoch": 2, "step": 24}], 30) == {}  # one world size: the row's
    assert batching.world_sizes_field(None, [], 6) == {}  # not elastic


def resolved(*overrides, **defaults):
    """A config as the CLI resolves it: the recipe's ``defaults`` (not the user's), then ``--set``."""
    from hvdtrain.core.resolve import load_config

    return load_config({"train": defaults} if defaults else None, None, list(overrides))


def test_issue_61_item_6_the_micro_batch_follows_from_the_global_batch_when_batch_size_is_not_set():
    """``--set train.global_batch_size=64`` on 2 workers: train.batch_size (the default 64, or a
    recipe's default) is not the user's, so each worker computes 32 per update (one micro-batch),
    and rank 0 says so; the adapter runs that micro-batch."""
    for cfg in (resolved("train.global_batch_size=64"), resolved("train.global_batch_size=64", batch_size=8)):
        assert rules.refusal(cfg, rules.World(size=2)) is None
        plan = batching.plan_for(cfg.train, 2)
        assert (plan.micro_batch, plan.accumulation, plan.samples_per_update) == (32, 1, 64)
        assert batching.derivation_note(cfg.train, 2).startswith(
            "train.batch_size=32 from train.global_batch_size=64 on 2 workers")
        ran = batching.as_run(cfg, 2)
        assert (ran.train.batch_size, ran.train.grad_accumulation) == (32, 1)
        assert cfg.train.batch_size in (64, 8)  # the user's config (config.yaml, --resume) stays as given
        assert batching.plan_for(cfg.train, 4).micro_batch == 16  # another world size: its own share
    # the same samples per update at any world size (the micro-batches are cut differently)
    train = resolved("train.global_batch_size=16").train
    by_world = {w: updates([batching.plan_for(train, w)] * w, 40) for w in (1, 2, 4)}
    assert [u.tolist() for u in by_world[1]] == [u.tolist() for u in by_world[2]] == [u.tolist() for u in by_world[4]]
    accumulating = resolved("train.global_batch_size=64", "train.grad_accumulation=2")
    plan = batching.plan_for(accumulating.train, 2)
    assert (plan.micro_batch, plan.accumulation) == (16, 2)


def test_issue_61_item_6_a_global_batch_the_workers_cannot_share_is_refused_naming_those_that_can():
    problem = rules.refusal(resolved("train.global_batch_size=30"), rules.World(size=4))
    assert problem == ("train.global_batch_size=30 cannot be shared equally by 4 workers (train.batch_size follows "
                       "from it, as it is not set); launch 1, 2, 3, 5, 6, 10, 15, 30 workers (the world sizes that "
                       "divide 30), or set train.batch_size and let the workers accumulate")
    with pytest.raises(ConfigError, match="^train.grad_accumulation=4 contradicts train.global_batch_size=30: "):
        resolved("train.global_batch_size=30", "train.grad_accumulation=4")  # fits no world size: before the job


def test_issue_61_item_6_both_keys_set_keep_the_refusal_and_bitwise_or_elastic_keep_the_batch_size():
    cfg = resolved("train.global_batch_size=64", "train.batch_size=64")  # the user's own micro-batch
    problem = rules.refusal(cfg, rules.World(size=2))
    assert "train.global_batch_size=64 is 1 micro-batches of train.batch_size=64, which 2 workers" in problem
    assert batching.derivation_note(cfg.train, 2) is None
    for extra in ("train.reproducible=world-size", "train.elastic=true"):  # the same micro-batches at any size
        train = resolved("train.global_batch_size=64", extra).train
        assert batching.plan_for(train, 1).micro_batch == 64 and batching.derivation_note(train, 1) is None
