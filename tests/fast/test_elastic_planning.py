"""Elastic planning in-process (issue 22, item 6): where an elastic run starts is one decision that
every worker takes, and a collective that fails inside the elastic state's sync is recoverable.

Two ranks are two threads, each running the real Trainer under Horovod's elastic driver
(``horovod.common.elastic.run_fn``, no launcher) on a NumPy adapter whose collectives meet in an
in-memory world. The real job (a rank 0 killed before the first sync, TensorFlow) is
``tests/reliability/test_elastic.py::test_rank_0_lost_before_the_first_sync_keeps_resume``.
"""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from numpy_adapter import NumpyAdapter
from toyrun import fit, snapshot_tree, without_timing

from hvdtrain.core.adapter import DistContext
from hvdtrain.core.loop import TrainingError

pytestmark = pytest.mark.elastic
pytest.importorskip("horovod.common.elastic")


class World:
    """Collectives among threads: every rank calls :meth:`meet` with the same name, in the same order."""

    def __init__(self, size: int):
        self.size, self.cond, self.slots, self.calls = size, threading.Condition(), {}, {}

    def meet(self, rank: int, name: str, value):
        seq = self.calls[(rank, name)] = self.calls.get((rank, name), 0) + 1
        key = (name, seq)
        with self.cond:
            self.slots.setdefault(key, {})[rank] = value
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: len(self.slots[key]) == self.size, timeout=10):
                raise TimeoutError(f"rank {rank}: collective {name} #{seq} was not joined by every rank")
            return pickle.loads(pickle.dumps([self.slots[key][r] for r in range(self.size)]))  # copies, as sent


class ThreadRank(NumpyAdapter):
    """Rank ``rank`` of ``world``: the NumPy adapter with real (in-memory) collectives."""

    def __init__(self, world: World, rank: int):
        super().__init__()
        self.world, self.rank = world, rank

    def context(self):
        return DistContext(rank=self.rank, size=self.world.size, local_rank=self.rank, local_size=self.world.size)

    def init(self, config):
        super().init(config)
        return self.context()

    def broadcast_state(self, root_rank=0):
        params, velocity = self.world.meet(self.rank, "state", (self.model.params, self.velocity))[root_rank]
        for k, v in params.items():
            self.model.params[k][...] = v
        self.velocity = {k: v.copy() for k, v in velocity.items()}

    def allreduce_sums(self, values):
        every = self.world.meet(self.rank, "sums", dict(values))
        return {k: float(sum(float(v[k]) for v in every)) for k in values}

    def broadcast_object(self, obj, root_rank=0):
        return self.world.meet(self.rank, "object", obj)[root_rank]

    def allgather_object(self, obj):
        return self.world.meet(self.rank, "gather", obj)

    def gather_object_to_root(self, obj):
        every = self.world.meet(self.rank, "gather_to_root", obj)
        return every if self.rank == 0 else None

    def scatter_objects_from_root(self, items):
        return self.world.meet(self.rank, "scatter", items)[0][self.rank]

    def barrier(self):
        self.world.meet(self.rank, "barrier", None)


def fit_ranks(output, *overrides, size=2):
    """Run the toy recipe on ``size`` thread ranks; returns each rank's result or exception."""
    world = World(size)

    def one(rank):
        try:
            return fit(output, *overrides, adapter=ThreadRank(world, rank))
        except Exception as exc:  # what this rank stopped with
            return exc

    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(one, range(size)))


def test_an_elastic_refusal_stops_every_worker_with_the_same_error(tmp_path):
    """Before, only rank 0 planned: it raised, and rank 1 went on alone (in a real job Horovod takes
    rank 0's exit for a lost host, and the survivor trained from scratch into the old run)."""
    fit(tmp_path, "train.epochs=1")
    before = snapshot_tree(tmp_path)
    outcomes = fit_ranks(tmp_path, "train.epochs=2", "train.elastic=true")
    assert all(isinstance(o, TrainingError) for o in outcomes), outcomes
    assert len({str(o) for o in outcomes}) == 1 and "--resume" in str(outcomes[0])
    assert snapshot_tree(tmp_path) == before


def test_an_elastic_resume_starts_every_worker_at_the_checkpoint(tmp_path):
    first = fit_ranks(tmp_path, "train.epochs=1", "train.elastic=true")[0]
    resumed = fit_ranks(tmp_path, "train.epochs=2", "train.elastic=true", "checkpoint.resume=true")
    for run in resumed:
        assert not isinstance(run, Exception), run
        assert run.result.history[:1] == first.result.history  # epoch 1 is the checkpoint's
        assert [r["epoch"] for r in run.result.history] == [1, 2]
        assert len(run.adapter.applied_lrs) == 6  # only epoch 2 trained: 48 samples per rank, batches of 8
    assert without_timing(resumed[0].result.history) == without_timing(resumed[1].result.history)


class BroadcastFailsOnce(NumpyAdapter):
    """The first state broadcast fails the way TensorFlow reports a collective that a lost worker
    left unfinished: its own error type, Horovod's op name in the message."""

    def __init__(self):
        super().__init__()
        self.failed = self.resets = 0

    def broadcast_state(self, root_rank=0):
        if not self.failed:
            self.failed = 1
            raise RuntimeError("Graph execution error: ... HorovodBroadcast_broadcast_variables_0 ... "
                               "Connection reset by peer")

    def elastic_reset(self):
        self.resets += 1


def test_a_collective_failing_inside_the_sync_reforms_instead_of_crashing(tmp_path):
    """Before, only the training body's errors were translated to HorovodInternalError: the same
    failure inside the state's sync escaped Horovod's elastic loop and the worker crashed."""
    adapter = BroadcastFailsOnce()
    run = fit(tmp_path, "train.elastic=true", adapter=adapter)
    assert adapter.failed and adapter.resets == 1
    assert [r["epoch"] for r in run.metrics()] == [1, 2]
