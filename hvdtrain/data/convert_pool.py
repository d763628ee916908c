"""The processes of ``hvdtrain convert`` (and ``--verify``): whole shards per task, results in this process.

``spawn``, not ``fork``: the caller may hold threads (a framework's, pyarrow's) that a forked
child would inherit mid-lock. Spawning costs each worker an interpreter and its imports (about a
second on a busy host), so :func:`start_pool` is called before the conversion is planned and the
workers start while the parent reads the source tree. Workers die with the parent (a killed
conversion leaves none behind: ``hvdtrain.data.workers``' parent-death watch).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable

from hvdtrain.data.workers import _die_with_parent, _main_not_reimported


def _start_worker(parent_pid: int, modules: tuple[str, ...]) -> None:
    _die_with_parent(parent_pid)
    for module in modules:
        importlib.import_module(module)


def start_pool(workers: int, modules: tuple[str, ...] = ()) -> ProcessPoolExecutor | None:
    """A pool of ``workers`` processes, starting now and importing ``modules`` (pyarrow takes a
    second) while the caller goes on; None for one worker (tasks then run in this process)."""
    if workers <= 1:
        return None
    with _main_not_reimported():
        pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_start_worker,
                                   initargs=(os.getpid(), tuple(modules)))
        for _ in range(workers):  # each submit to a pool with no idle worker spawns one, here, while __main__ is hidden
            pool.submit(int)
    return pool


def run_tasks(function: Callable, tasks: list, pool: ProcessPoolExecutor | None,
              done: Callable[[int, object], None]) -> None:
    """``function(task)`` for every task, in ``pool`` (None: in this process), calling ``done(i,
    result)`` here as each finishes, in the order they finish; the first failure is raised."""
    if pool is None:
        for i, task in enumerate(tasks):
            done(i, function(task))
        return
    futures = {pool.submit(function, task): i for i, task in enumerate(tasks)}
    pending = set(futures)
    try:
        while pending:
            ready, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(ready, key=futures.get):
                done(futures[future], future.result())
    finally:
        for future in pending:
            future.cancel()
