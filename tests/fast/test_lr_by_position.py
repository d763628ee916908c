"""The LR follows hvdtrain.core.schedule at the position in the data, before and after a resume."""

from __future__ import annotations

import pytest
from toyrun import Interrupt, StopAt, fit, toy_config, without_timing

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.schedule import build_schedule, schedule_step

pytestmark = pytest.mark.lr_schedule

SAMPLES, BATCH = 96, 8
SCHEDULE = ("optim.warmup_epochs=0.5", "optim.decay=cosine", "optim.min_lr_ratio=0.1", "train.epochs=2")


def expected_lrs(config, epochs: int) -> list[float]:
    """The schedule's LR at every optimizer update's position (world size 1)."""
    accumulation = config.train.grad_accumulation
    micro = SAMPLES // BATCH
    steps = micro // accumulation
    schedule = build_schedule(config.optim, 1, steps, config.train.epochs, accumulation)
    return [schedule(schedule_step(epoch, update * accumulation * BATCH, BATCH * accumulation, steps))
            for epoch in range(epochs) for update in range(steps)]


class StepLRs(Callback):
    """The LR and step count the loop reports after every micro-batch."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def on_step_end(self, epoch, step, logs):
        self.seen.append((logs["global_step"], logs["lr"]))


@pytest.mark.parametrize("accumulation", [1, 2])
def test_every_update_uses_the_schedule_at_its_position(tmp_path, accumulation):
    overrides = (*SCHEDULE, f"train.grad_accumulation={accumulation}")
    seen = StepLRs()
    run = fit(tmp_path, *overrides, callbacks=[seen])
    expected = expected_lrs(toy_config(tmp_path, *overrides), 2)
    assert run.adapter.applied_lrs == pytest.approx(expected, rel=1e-12)
    assert len(set(expected)) > 8  # warmup and decay: the LR does change
    # the loop's report after every micro-batch: the LR of the update its window belongs to
    assert [lr for _, lr in seen.seen] == pytest.approx([expected[i // accumulation] for i in range(2 * 12)],
                                                        rel=1e-12)
    # metrics.jsonl: the LR of each epoch's last update
    steps = 12 // accumulation
    assert [r["lr"] for r in run.metrics()] == pytest.approx([expected[steps * e - 1] for e in (1, 2)],
                                                              rel=1e-12)
    assert [r["step"] for r in run.metrics()] == [steps, 2 * steps]


@pytest.mark.parametrize("stop_at", [8, 20])  # inside epoch 1, inside epoch 2 (after epoch-0001)
def test_a_resumed_run_records_the_same_lrs_as_an_uninterrupted_one(tmp_path, stop_at):
    overrides = (*SCHEDULE, "checkpoint.every_steps=5", "checkpoint.keep_last=100")
    reference = fit(tmp_path / "reference", *overrides)
    with pytest.raises(Interrupt):
        fit(tmp_path / "run", *overrides, callbacks=[StopAt(stop_at)])
    resumed = fit(tmp_path / "run", *overrides, "checkpoint.resume=true")
    restart = (stop_at - 1) // 5 * 5  # the last step checkpoint before the interruption (5 or 15)
    assert resumed.adapter.applied_lrs == reference.adapter.applied_lrs[restart:]
    assert [r["lr"] for r in resumed.metrics()] == [r["lr"] for r in reference.metrics()]
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())
