"""The loop only loops (issue 21, item 5): ``core/loop.py`` stays under 300 lines, what moved out of
it is still importable from where users import it, and the preemption check that moved into
:class:`~hvdtrain.core.preemption.PreemptionWatch` decides its own cadence and reads the epoch's
loss (a host synchronisation on a GPU) only when it stops."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from numpy_adapter import NumpyAdapter
from toyrun import toy_config

import hvdtrain
from hvdtrain.core import errors, outputdir, results, resume
from hvdtrain.core.checkpoint import CheckpointManager
from hvdtrain.core.preemption import PreemptionWatch, Preempted
from hvdtrain.core.results import EpochStats
from hvdtrain.core.resume import Position
from hvdtrain.core.saving import CheckpointPolicy

pytestmark = pytest.mark.resume


def test_the_loop_module_is_at_most_300_lines():
    lines = (Path(hvdtrain.__file__).parent / "core" / "loop.py").read_text().count("\n")
    assert lines <= 300, f"hvdtrain/core/loop.py has {lines} lines; issue 21 allows 300"


def test_names_moved_out_of_the_loop_are_importable_from_it():
    from hvdtrain.core.loop import (CONFIG_FILE, METRICS_FILE, EpochStats, RunResult, Trainer, TrainingError,
                                    TrainingState, train)
    assert (RunResult, TrainingState, EpochStats) == (results.RunResult, results.TrainingState, results.EpochStats)
    assert (CONFIG_FILE, METRICS_FILE, TrainingError) == (outputdir.CONFIG_FILE, resume.METRICS_FILE,
                                                          errors.TrainingError)
    assert hvdtrain.RunResult is RunResult and callable(train) and callable(Trainer.fit)
    assert issubclass(hvdtrain.Trainer, Trainer)  # the kernel with the default callbacks and checks


class DeviceScalar:
    """Stands for a loss sum held on a GPU: each read (``float``) is a host synchronisation, counted."""

    def __init__(self, value: float) -> None:
        self.value, self.reads = value, 0

    def __float__(self) -> float:
        self.reads += 1
        return self.value


def test_the_step_check_stops_only_at_an_optimizer_step_and_reads_the_loss_only_then(tmp_path):
    config = toy_config(tmp_path, "checkpoint.enabled=false")
    adapter = NumpyAdapter()
    ctx = adapter.init(config)
    policy = CheckpointPolicy(config, CheckpointManager(tmp_path / "checkpoints", 2), adapter, watchdog=None)
    stats = EpochStats(global_step=3, loss_sum=DeviceScalar(1.5), samples=8)
    here = Position(0, 24, 3)
    with PreemptionWatch("USR1", rank=0) as watch:
        watch.maybe_stop(policy, ctx, here, stats, applied=True, last_in_epoch=False, saved=False)  # no signal
        assert stats.loss_sum.reads == 0
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watch.received == ["USR1"]
        watch.maybe_stop(policy, ctx, here, stats, applied=False, last_in_epoch=False, saved=False)  # mid-window
        watch.maybe_stop(policy, ctx, here, stats, applied=True, last_in_epoch=True, saved=False)  # epoch's last
        watch.at_epoch_end(policy, ctx, Position(1, 0, 3), more_epochs=False)  # the run ends anyway
        assert stats.loss_sum.reads == 0
        with pytest.raises(Preempted) as stopped:
            watch.maybe_stop(policy, ctx, here, stats, applied=True, last_in_epoch=False, saved=False)
        assert stats.loss_sum.reads == 1 and stopped.value.checkpoint is None
        assert "after optimizer step 3 (epoch 1)" in str(stopped.value)
        with pytest.raises(Preempted, match=r"after optimizer step 3 \(epoch 1\); no checkpoint written"):
            watch.at_epoch_end(policy, ctx, Position(1, 0, 3), more_epochs=True)
