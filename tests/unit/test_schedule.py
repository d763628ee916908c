"""hvdtrain.core.schedule: LR scaling with world size, warmup and decay."""

from __future__ import annotations

import math

import pytest

from hvdtrain.core.resolve import load_config
from hvdtrain.core.schedule import LRSchedule, build_schedule, scale_lr, schedule_step

BASE, PEAK = 0.1, 0.8


@pytest.mark.parametrize("world_size", [1, 2, 4, 9, 16])
def test_scale_lr_rules(world_size):
    assert scale_lr(0.1, world_size, "linear") == pytest.approx(0.1 * world_size)
    assert scale_lr(0.1, world_size, "sqrt") == pytest.approx(0.1 * math.sqrt(world_size))
    assert scale_lr(0.1, world_size, "none") == pytest.approx(0.1)


def test_scale_lr_examples():
    assert scale_lr(0.0125, 8, "linear") == pytest.approx(0.1)
    assert scale_lr(0.5, 4, "sqrt") == pytest.approx(1.0)
    assert scale_lr(0.5, 4, "none") == 0.5


def test_scale_lr_bad_rule():
    with pytest.raises(ValueError) as err:
        scale_lr(0.1, 4, "cubic")
    for part in ("'cubic'", "linear", "sqrt", "none"):
        assert part in str(err.value)


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
@pytest.mark.parametrize("warmup", [1, 2, 8])
def test_warmup_ramps_linearly_to_peak(warmup, decay):
    schedule = LRSchedule(BASE, PEAK, warmup_steps=warmup, total_steps=100, decay=decay)
    lrs = [schedule(step) for step in range(warmup)]
    increment = (PEAK - BASE) / warmup
    # a straight line from base_lr (at step -1) that reaches peak_lr at step warmup_steps - 1
    for step, lr in enumerate(lrs):
        assert lr == pytest.approx(BASE + increment * (step + 1))
    assert lrs[-1] == pytest.approx(PEAK)
    assert all(BASE < lr <= PEAK + 1e-12 for lr in lrs)
    assert all(b > a for a, b in zip(lrs, lrs[1:]))
    # the first step after warmup is still at the peak
    assert schedule(warmup) == pytest.approx(PEAK)


def test_warmup_from_a_higher_base_ramps_down():
    schedule = LRSchedule(base_lr=0.4, peak_lr=0.1, warmup_steps=3, total_steps=10, decay="constant")
    assert [schedule(s) for s in range(3)] == pytest.approx([0.3, 0.2, 0.1])


def test_no_warmup_starts_at_peak():
    schedule = LRSchedule(BASE, PEAK, warmup_steps=0, total_steps=50, decay="cosine")
    assert schedule(0) == pytest.approx(PEAK)


@pytest.mark.parametrize("decay", ["cosine", "linear"])
@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("warmup, total", [(0, 50), (8, 101), (5, 7), (3, 40)])
def test_decay_reaches_the_floor_at_the_last_step(decay, min_lr_ratio, warmup, total):
    schedule = LRSchedule(BASE, PEAK, warmup, total, decay=decay, min_lr_ratio=min_lr_ratio)
    floor = PEAK * min_lr_ratio
    after = [schedule(step) for step in range(warmup, total)]
    assert after[0] == pytest.approx(PEAK)
    assert after[-1] == pytest.approx(floor)
    assert schedule(total - 1) == pytest.approx(floor)
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:]))
    assert all(floor - 1e-12 <= lr <= PEAK + 1e-12 for lr in after)
    # past the end it stays at the floor
    assert schedule(total + 10) == pytest.approx(floor)


def test_cosine_and_linear_shapes():
    # warmup 8, total 101: the decay spans steps 8..100 (92 intervals)
    kwargs = dict(base_lr=BASE, peak_lr=PEAK, warmup_steps=8, total_steps=101, min_lr_ratio=0.25)
    cosine, linear = LRSchedule(decay="cosine", **kwargs), LRSchedule(decay="linear", **kwargs)
    floor = PEAK * 0.25
    quarter, half = 8 + 23, 8 + 46
    assert cosine(half) == pytest.approx((PEAK + floor) / 2)
    assert linear(half) == pytest.approx((PEAK + floor) / 2)
    assert cosine(quarter) == pytest.approx(floor + (PEAK - floor) * 0.5 * (1 + math.cos(math.pi / 4)))
    assert linear(quarter) == pytest.approx(floor + (PEAK - floor) * 0.75)
    assert cosine(quarter) > linear(quarter)
    # linear decay drops by the same amount every step
    drops = [linear(s) - linear(s + 1) for s in range(8, 100)]
    assert drops == pytest.approx([drops[0]] * len(drops))


def test_constant_stays_at_peak():
    schedule = LRSchedule(BASE, PEAK, warmup_steps=4, total_steps=30, decay="constant", min_lr_ratio=0.5)
    assert [schedule(s) for s in range(4, 40)] == pytest.approx([PEAK] * 36)


def test_schedule_is_pure():
    schedule = LRSchedule(BASE, PEAK, 5, 50)
    first = [schedule(s) for s in range(50)]
    assert [schedule(s) for s in range(50)] == first


def test_unknown_decay_is_rejected():
    schedule = LRSchedule(BASE, PEAK, warmup_steps=2, total_steps=10, decay="step")
    with pytest.raises(ValueError) as err:
        schedule(5)
    for part in ("'step'", "cosine", "linear", "constant"):
        assert part in str(err.value)


def test_build_schedule_uses_warmup_epochs_times_steps_per_epoch():
    optim = load_config(overrides=["optim.lr=0.01", "optim.lr_scaling=linear", "optim.warmup_epochs=2",
                                   "optim.decay=linear", "optim.min_lr_ratio=0.1"]).optim
    schedule = build_schedule(optim, world_size=4, steps_per_epoch=10, epochs=5)
    assert schedule == LRSchedule(base_lr=0.01, peak_lr=pytest.approx(0.04), warmup_steps=20, total_steps=50,
                                  decay="linear", min_lr_ratio=0.1)
    assert schedule(19) == pytest.approx(0.04)
    assert schedule(18) < schedule(19)
    assert schedule(49) == pytest.approx(0.004)


@pytest.mark.parametrize("warmup_epochs, steps_per_epoch, expected", [
    (0.0, 10, 0), (0.5, 10, 5), (0.2, 469, 94), (3, 7, 21), (1.0, 1, 1),
])
def test_build_schedule_warmup_steps(warmup_epochs, steps_per_epoch, expected):
    optim = load_config(overrides=[f"optim.warmup_epochs={warmup_epochs}"]).optim
    schedule = build_schedule(optim, world_size=2, steps_per_epoch=steps_per_epoch, epochs=3)
    assert schedule.warmup_steps == expected
    assert schedule.total_steps == 3 * steps_per_epoch


@pytest.mark.parametrize("rule, world_size, peak", [("linear", 8, 0.8), ("sqrt", 4, 0.2), ("none", 8, 0.1)])
def test_build_schedule_scales_the_peak(rule, world_size, peak):
    optim = load_config(overrides=["optim.lr=0.1", f"optim.lr_scaling={rule}", "optim.warmup_epochs=0",
                                   "optim.decay=constant"]).optim
    schedule = build_schedule(optim, world_size=world_size, steps_per_epoch=5, epochs=2)
    assert schedule.base_lr == pytest.approx(0.1)
    assert schedule.peak_lr == pytest.approx(peak)
    assert schedule(0) == pytest.approx(peak)


def test_build_schedule_has_at_least_one_step():
    optim = load_config().optim
    assert build_schedule(optim, world_size=1, steps_per_epoch=0, epochs=3).total_steps == 1


# --- issue 10: one notion of progress (the position in the data) for any world size ------------

def _optim(*overrides):
    return load_config(overrides=list(overrides)).optim


def test_a_reform_runs_the_lr_the_schedule_gives_for_the_samples_seen():
    # The case: 90 epochs of cosine from base LR 0.1 (linear scaling), 8 workers, then 4 from
    # epoch 45. 1,000 updates per epoch at 8 workers, 2,000 at 4 (the global batch halves).
    optim = _optim("optim.lr=0.1", "optim.lr_scaling=linear", "optim.warmup_epochs=0", "optim.decay=cosine")
    samples_per_epoch = 8 * 1000 * 32
    four = build_schedule(optim, world_size=4, steps_per_epoch=2000, epochs=90)
    at_45 = four(schedule_step(45, 0, samples_per_step=4 * 32, steps_per_epoch=2000))
    assert at_45 == pytest.approx(0.2, rel=1e-3)  # half of the cosine, peak 0.4 for 4 workers
    last = four(schedule_step(89, samples_per_epoch - 4 * 32, samples_per_step=4 * 32, steps_per_epoch=2000))
    assert last == pytest.approx(0.0, abs=1e-6)
    # before the change, 8 workers at the same position: half of peak 0.8
    eight = build_schedule(optim, world_size=8, steps_per_epoch=1000, epochs=90)
    assert eight(schedule_step(45, 0, samples_per_step=8 * 32, steps_per_epoch=1000)) == pytest.approx(0.4, rel=1e-3)


def test_schedule_step_equals_the_update_count_without_a_change():
    for step in range(0, 50):
        epoch, within = divmod(step, 10)
        assert schedule_step(epoch, within * 64, samples_per_step=64, steps_per_epoch=10) == step


def test_mid_epoch_position_after_a_world_size_change_is_fractional():
    # 128 samples consumed by 1 worker at batch 16 (8 of its updates) = 2 updates of 4 workers
    assert schedule_step(1, 128, samples_per_step=64, steps_per_epoch=8) == 10
    assert schedule_step(1, 96, samples_per_step=64, steps_per_epoch=8) == 9.5


@pytest.mark.parametrize("name, expected", [("sgd", 8 * 0.1), ("adam", math.sqrt(8) * 0.1),
                                            ("adamw", math.sqrt(8) * 0.1)])
def test_auto_scaling_is_linear_for_sgd_and_sqrt_for_adam(name, expected):
    optim = _optim(f"optim.name={name}", "optim.lr=0.1")
    assert optim.lr_scaling == "auto"
    assert build_schedule(optim, world_size=8, steps_per_epoch=5, epochs=1).peak_lr == pytest.approx(expected)


def test_scaling_counts_accumulated_micro_batches():
    optim = _optim("optim.lr=0.1", "optim.lr_scaling=linear")
    assert build_schedule(optim, 2, 5, 1, grad_accumulation=4).peak_lr == pytest.approx(0.8)
    optim = _optim("optim.lr=0.1", "optim.lr_scaling=sqrt")
    assert build_schedule(optim, 2, 5, 1, grad_accumulation=8).peak_lr == pytest.approx(0.4)
