"""Elastic mode's commit decisions, in-process: when the state is committed, and what a failure rolls back.

Horovod's elastic driver (``horovod.common.elastic.run_fn``) runs in this process with one worker and
no rendezvous: a collective failure is stood in for by the adapter raising ``HorovodInternalError``
before an update, which rolls the run back to the last commit. Needs Horovod's Python package
(installed by ``make setup``), no launcher.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from numpy_adapter import NumpyAdapter
from toyrun import fit

pytestmark = pytest.mark.elastic

exceptions = pytest.importorskip("horovod.common.exceptions")
pytest.importorskip("horovod.common.elastic")


class ElasticNumpyAdapter(NumpyAdapter):
    """Counts updates, records the update count at every commit (``snapshot``) and rollback
    (``restore_snapshot``), and fails once before update ``fail_before``."""

    def __init__(self, fail_before: int | None = None) -> None:
        super().__init__()
        self.updates, self.fail_before = 0, fail_before
        self.commits: list[int] = []
        self.rollbacks: list[int] = []
        self.resets = 0

    def train_step(self, inputs, targets, apply_update=True, weight=None):
        if apply_update and self.fail_before == self.updates + 1:
            self.fail_before = None
            raise exceptions.HorovodInternalError(f"injected collective failure before update {self.updates + 1}")
        loss = super().train_step(inputs, targets, apply_update, weight)
        self.updates += int(apply_update)
        return loss

    def snapshot(self):
        self.commits.append(self.updates)
        return (super().snapshot(), self.updates, copy.copy(self.applied_lrs))

    def restore_snapshot(self, snapshot):
        inner, self.updates, self.applied_lrs = snapshot
        super().restore_snapshot(inner)
        self.rollbacks.append(self.updates)

    def elastic_reset(self):
        self.resets += 1


def commits_after_start(adapter: ElasticNumpyAdapter) -> list[int]:
    """The distinct update counts at which the state was committed once training ran."""
    return sorted({c for c in adapter.commits if c > 0})


@pytest.mark.parametrize("every, checkpoint_every, expected", [
    (5, 0, [5, 10, 12, 15, 20, 24]),  # every 5 updates, and at each epoch end (12, 24)
    (5, 4, [4, 5, 8, 10, 12, 15, 16, 20, 24]),  # and at every step checkpoint (4, 8, 16, 20)
])
def test_commits_every_n_updates_at_checkpoints_and_epoch_ends(tmp_path, every, checkpoint_every, expected):
    adapter = ElasticNumpyAdapter()
    run = fit(tmp_path, "train.elastic=true", f"train.elastic_commit_every={every}",
              f"checkpoint.every_steps={checkpoint_every}", "checkpoint.keep_last=100", adapter=adapter)
    assert commits_after_start(adapter) == expected
    assert adapter.rollbacks == [] and adapter.resets == 0
    assert [r["epoch"] for r in run.metrics()] == [1, 2]


def test_a_failure_rolls_back_to_the_last_commit_and_redoes_only_what_followed(tmp_path):
    adapter = ElasticNumpyAdapter(fail_before=8)
    run = fit(tmp_path, "train.elastic=true", "train.elastic_commit_every=5", "checkpoint.keep_last=100",
              adapter=adapter)
    assert adapter.rollbacks == [5] and adapter.resets == 1  # back to the commit at update 5
    assert adapter.updates == 24  # counted from the restored state: no update lost or repeated in the result
    assert len(adapter.applied_lrs) == 24
    assert [r["epoch"] for r in run.metrics()] == [1, 2] and [r["step"] for r in run.metrics()] == [12, 24]
    assert run.names() == ["epoch-0001", "epoch-0002"]


def test_the_default_snapshot_puts_back_what_save_state_writes(tmp_path):
    """An adapter that writes no snapshot of its own gets one built on save_state/load_state."""
    from hvdtrain.core.adapter import FrameworkAdapter

    class SavedStateSnapshots(NumpyAdapter):
        snapshot = FrameworkAdapter.snapshot
        restore_snapshot = FrameworkAdapter.restore_snapshot

    adapter = SavedStateSnapshots()
    run = fit(tmp_path, "train.epochs=1", adapter=adapter)
    saved = {k: v.copy() for k, v in adapter.model.params.items()}
    velocity = {k: v.copy() for k, v in adapter.velocity.items()}
    snapshot = adapter.snapshot()
    for k in adapter.model.params:
        adapter.model.params[k] += 1.0
        adapter.velocity[k] *= 0.0
    adapter.restore_snapshot(snapshot)
    assert all((adapter.model.params[k] == saved[k]).all() for k in saved)
    assert all((adapter.velocity[k] == velocity[k]).all() for k in velocity)
    assert run.result.final["epoch"] == 1


class WindowedNumpyAdapter(ElasticNumpyAdapter):
    """Drops a window cut short at an elastic sync (``restart_window``), as the real adapters do."""

    def restart_window(self, accumulation):
        super().restart_window(accumulation)
        self.pending = None


def test_a_fixed_global_batch_rolled_back_inside_an_update_ends_as_if_never_interrupted(tmp_path, monkeypatch):
    """Issue 42, item 2: a failure inside an update's accumulation window (the first of its two
    micro-batches done) rolls back to the commit at update 6; every sync restarts the window, so the
    half-window's gradient is not added to the next update and the run ends with the uninterrupted
    run's weights, bit for bit (no dropout: a rollback reseeds the rank's own stream)."""
    import numpy_adapter

    monkeypatch.setattr(numpy_adapter, "DROPOUT", 0.0)
    common = ("train.elastic=true", "train.elastic_commit_every=5", "train.global_batch_size=16")  # 2 x 8 per update
    smooth = WindowedNumpyAdapter()
    fit(tmp_path / "smooth", *common, adapter=smooth)
    broken = WindowedNumpyAdapter(fail_before=9)
    run = fit(tmp_path / "broken", *common, adapter=broken)
    assert broken.rollbacks == [6] and broken.updates == smooth.updates == 12
    assert broken.accumulation == 2
    assert all(np.array_equal(broken.model.params[k], smooth.model.params[k]) for k in smooth.model.params)
    assert [r["step"] for r in run.metrics()] == [6, 12] and "world_sizes" not in run.metrics()[1]
