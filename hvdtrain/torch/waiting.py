"""How a torch process waits for a Horovod collective: polling with a sleep that backs off,
instead of Horovod's spin.

Horovod's ``synchronize(handle)`` (behind ``hvd.allreduce``, ``hvd.broadcast``, ``hvd.allgather``,
the ``DistributedOptimizer``'s step and every other blocking torch collective) waits in C++ in a
loop of ``std::this_thread::yield()`` (``WaitAndClear`` in horovod/torch/mpi_ops_v2.cc): a rank
that waits for a slower peer keeps a core busy, half of it in ``sched_yield`` system calls. Where
the ranks have the cores to themselves that costs nothing anyone sees; where they share them (more
ranks than cores, decoding workers beside the ranks, other jobs on the node, two jobs side by side)
the spinning rank takes the CPU the others need to catch up. Measured on 2 cores with two 2-rank
jobs side by side (BENCHMARKS.md, "Waiting for a collective"): each job used less CPU and finished
sooner with this wait.

:func:`wait` polls the handle (Horovod's public ``poll``) for :data:`SPIN_SECONDS`, then sleeps
between polls, from :data:`FIRST_SLEEP` doubling up to :data:`LONGEST_SLEEP`, and then calls
Horovod's own ``synchronize``, which finds the collective done and returns its result or raises
its error as before (``HorovodInternalError`` for an elastic re-form included). A collective that
ends while the waiter sleeps is seen at most :data:`LONGEST_SLEEP` late.

:func:`install` puts :func:`wait` in place of ``synchronize`` wherever Horovod's torch modules hold
it (``horovod.torch``, ``.mpi_ops``, ``.optimizer``, ``.functions``, ``.sync_batch_norm``), once
per process; ``hvdtrain.torch`` does so when it is imported. ``HVDTRAIN_TORCH_WAIT=spin`` keeps
Horovod's own wait (the lowest latency where every rank has its own core and nothing else runs).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

SPIN_SECONDS = 50e-6  # poll without sleeping this long first: a collective that is about done costs no sleep
FIRST_SLEEP = 50e-6
LONGEST_SLEEP = 500e-6  # the most a finished collective waits to be seen
POLICIES = ("backoff", "spin")
VARIABLE = "HVDTRAIN_TORCH_WAIT"


def wait_until(done: Callable[[], bool], sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.perf_counter) -> int:
    """Return once ``done()`` is true: polled for :data:`SPIN_SECONDS`, then between sleeps that
    double from :data:`FIRST_SLEEP` to :data:`LONGEST_SLEEP`. Returns the number of sleeps."""
    spin_until = clock() + SPIN_SECONDS
    while not done():
        if clock() >= spin_until:
            break
    else:
        return 0
    sleeps, delay = 0, FIRST_SLEEP
    while not done():
        sleep(delay)
        sleeps += 1
        delay = min(delay * 2, LONGEST_SLEEP)
    return sleeps


def policy(environ: dict[str, str] | None = None) -> str:
    """The wait policy from ``HVDTRAIN_TORCH_WAIT`` (default ``backoff``); any other value is refused
    in one line naming the variable and the allowed values."""
    value = (os.environ if environ is None else environ).get(VARIABLE, "backoff").strip().lower() or "backoff"
    if value not in POLICIES:
        raise ValueError(f"{VARIABLE}={value!r} is not a wait policy: use one of {', '.join(POLICIES)}")
    return value


def make_wait(mpi_ops: Any) -> Callable[[int], Any]:
    """A ``synchronize(handle)`` for Horovod's torch ``mpi_ops`` module that waits by
    :func:`wait_until` before handing over to the module's own ``synchronize``."""
    original, poll = mpi_ops.synchronize, mpi_ops.poll

    def wait(handle: int) -> Any:
        """Horovod's ``synchronize(handle)``, waiting by polling with backoff (hvdtrain.torch.waiting)."""
        # the module's handle map is looked up on each call: hvd.init() binds a new one (and an
        # elastic re-form calls init again), so one held from import time would never hold a handle
        if handle in mpi_ops._handle_map:  # Horovod's own returns None for a handle it does not know
            wait_until(lambda: poll(handle))
        return original(handle)

    wait.__wrapped__ = original  # type: ignore[attr-defined]
    wait.hvdtrain_wait = True  # type: ignore[attr-defined]
    return wait


def install(environ: dict[str, str] | None = None) -> bool:
    """Put the backoff wait in place of Horovod's torch ``synchronize`` in every Horovod torch
    module that holds it (idempotent). Returns whether it is in place (False under
    ``HVDTRAIN_TORCH_WAIT=spin``)."""
    if policy(environ) == "spin":
        return False
    import horovod.torch  # noqa: F401  (the package imports every module that holds synchronize)
    from horovod.torch import mpi_ops

    if getattr(mpi_ops.synchronize, "hvdtrain_wait", False):
        return True
    original, wait = mpi_ops.synchronize, make_wait(mpi_ops)
    for name, module in list(sys.modules.items()):
        if (name == "horovod.torch" or name.startswith("horovod.torch.")) and \
                getattr(module, "synchronize", None) is original:
            module.synchronize = wait
    return True
