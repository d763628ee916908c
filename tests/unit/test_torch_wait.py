"""hvdtrain.torch.waiting: a torch collective is waited for by polling with backoff, not by
Horovod's spin; ``HVDTRAIN_TORCH_WAIT`` picks the policy. Every real torch job of the suite runs
through it (tests/distributed); benchmarks/torch_wait.py measures what it saves."""

from __future__ import annotations

import sys

import pytest

from hvdtrain.torch import waiting


class Clock:
    """A clock that advances only when slept on, or by ``tick`` per reading."""

    def __init__(self, tick: float = 0.0):
        self.now, self.tick, self.sleeps = 0.0, tick, []

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_collective_that_is_done_costs_no_sleep():
    clock = Clock()
    assert waiting.wait_until(lambda: True, sleep=clock.sleep, clock=clock) == 0
    assert clock.sleeps == []


def test_a_collective_done_within_the_spin_is_polled_without_sleeping():
    clock, polls = Clock(tick=1e-6), iter([False] * 10 + [True])
    assert waiting.wait_until(lambda: next(polls), sleep=clock.sleep, clock=clock) == 0


def test_a_long_wait_sleeps_doubling_up_to_the_longest_sleep():
    clock = Clock(tick=1e-5)  # the spin ends after a few polls
    done_at = 0.01
    sleeps = waiting.wait_until(lambda: clock.now >= done_at, sleep=clock.sleep, clock=clock)
    assert sleeps == len(clock.sleeps) > 0
    assert clock.sleeps[:4] == pytest.approx([50e-6, 100e-6, 200e-6, 400e-6])
    assert max(clock.sleeps) == waiting.LONGEST_SLEEP and set(clock.sleeps[4:]) == {waiting.LONGEST_SLEEP}
    assert clock.now - done_at <= waiting.LONGEST_SLEEP + 1e-5  # seen at most one longest sleep late


def test_the_policy_comes_from_the_variable_and_a_bad_value_is_named():
    assert waiting.policy({}) == "backoff"
    assert waiting.policy({"HVDTRAIN_TORCH_WAIT": "spin"}) == "spin"
    assert waiting.policy({"HVDTRAIN_TORCH_WAIT": " Backoff "}) == "backoff"
    with pytest.raises(ValueError, match=r"HVDTRAIN_TORCH_WAIT='busy' is not a wait policy: use one of backoff, spin"):
        waiting.policy({"HVDTRAIN_TORCH_WAIT": "busy"})


def test_importing_hvdtrain_torch_puts_the_wait_in_every_horovod_torch_module_that_holds_synchronize():
    import hvdtrain.torch  # noqa: F401
    import horovod.torch as hvd
    from horovod.torch import mpi_ops

    holders = {name: module.synchronize for name, module in sys.modules.items()
               if (name == "horovod.torch" or name.startswith("horovod.torch.")) and hasattr(module, "synchronize")}
    assert {"horovod.torch", "horovod.torch.mpi_ops", "horovod.torch.optimizer"} <= holders.keys()
    assert all(getattr(f, "hvdtrain_wait", False) for f in holders.values()), holders
    assert hvd.synchronize is mpi_ops.synchronize
    assert waiting.install() is True and hvd.synchronize is mpi_ops.synchronize  # idempotent: not wrapped twice
    assert not getattr(mpi_ops.synchronize.__wrapped__, "hvdtrain_wait", False)
    assert hvd.synchronize(987654321) is None  # a handle Horovod does not know: its own answer, no poll


WAITED_AFTER_INIT = """
import torch
import hvdtrain.torch  # installs the wait before Horovod is initialised, as every job does
import horovod.torch as hvd
from hvdtrain.torch import waiting

calls = []
inner = waiting.wait_until
waiting.wait_until = lambda done, **kw: calls.append(1) or inner(done, **kw)
for _ in range(2):  # hvd.init() binds Horovod's handle map anew each time (an elastic re-form inits again)
    hvd.init()
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum)
    hvd.broadcast_parameters({"w": torch.zeros(2)}, root_rank=0)
    hvd.shutdown()
print(len(calls), float(total.sum()))
"""


def test_collectives_after_horovod_init_are_waited_for_by_the_backoff(tmp_path):
    """Real Horovod, one process: after ``hvd.init()`` (and again after a second init, as an
    elastic re-form does) every blocking collective goes through :func:`waiting.wait_until`.
    Until 2026-11-28 the wait held the handle map Horovod had at import time, which ``hvd.init()``
    replaces, so no real job ever reached the backoff: every wait was Horovod's spin."""
    from jobs import run

    proc = run([sys.executable, "-c", WAITED_AFTER_INIT], timeout=120, cwd=tmp_path,
               env={"HVDTRAIN_TORCH_WAIT": "backoff", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"})
    waits, total = proc.stdout.split()[-2:]
    assert float(total) == 3.0
    assert int(waits) >= 4, proc.stdout  # an allreduce and a broadcast per init, twice
