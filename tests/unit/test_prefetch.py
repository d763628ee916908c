"""hvdtrain.core.prefetch: background batch loading that keeps order, errors and shutdown right."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from hvdtrain.core.prefetch import prefetch

pytestmark = pytest.mark.timeout(20)

DEPTHS = [0, 1, 3]


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hvdtrain-prefetch"]


def _wait_for_no_prefetch_threads(timeout: float = 60.0) -> None:  # a hang bound; returns when they are gone
    deadline = time.monotonic() + timeout
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _prefetch_threads() == []


@pytest.mark.parametrize("depth", DEPTHS)
def test_order_is_preserved(depth):
    def load(i):
        time.sleep(0.001 * (i % 3))  # uneven load times
        return i * i

    assert list(prefetch(range(40), load, depth=depth)) == [i * i for i in range(40)]
    _wait_for_no_prefetch_threads()


@pytest.mark.parametrize("depth", DEPTHS)
def test_empty_input(depth):
    assert list(prefetch([], lambda i: i, depth=depth)) == []


@pytest.mark.parametrize("depth", DEPTHS)
def test_load_exception_is_raised_after_earlier_items(depth):
    error = ValueError("bad sample 5")

    def load(i):
        if i == 5:
            raise error
        return i

    got = []
    with pytest.raises(ValueError) as err:
        for value in prefetch(range(10), load, depth=depth):
            got.append(value)
    assert err.value is error
    assert got == [0, 1, 2, 3, 4]
    _wait_for_no_prefetch_threads()


@pytest.mark.parametrize("depth", DEPTHS)
def test_exception_from_the_items_iterator_is_raised(depth):
    def items():
        yield 0
        yield 1
        raise KeyError("index file vanished")

    got = []
    with pytest.raises(KeyError, match="index file vanished"):
        for value in prefetch(items(), lambda i: i + 100, depth=depth):
            got.append(value)
    assert got == [100, 101]
    _wait_for_no_prefetch_threads()


@pytest.mark.parametrize("depth", [1, 3])
def test_loading_runs_in_a_background_thread(depth):
    threads = set(prefetch(range(5), lambda i: threading.current_thread().name, depth=depth))
    assert threads == {"hvdtrain-prefetch"}


def test_depth_zero_loads_inline():
    main = threading.current_thread().name
    assert set(prefetch(range(5), lambda i: threading.current_thread().name, depth=0)) == {main}


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_reads_ahead_at_most_depth_items(depth):
    loaded = []
    gen = prefetch(itertools.count(), lambda i: loaded.append(i) or i, depth=depth)
    assert next(gen) == 0
    time.sleep(0.2)  # let the worker fill the buffer
    # consumed 1, `depth` waiting in the buffer, at most one more blocked on putting
    assert depth + 1 <= len(loaded) <= 1 + depth + 1
    gen.close()
    _wait_for_no_prefetch_threads()


@pytest.mark.parametrize("depth", [1, 3])
def test_breaking_early_does_not_hang(depth):
    loaded = []

    def consume():
        for value in prefetch(itertools.count(), lambda i: loaded.append(i) or i, depth=depth):
            if value == 3:
                break  # the generator is closed when it is released

    consume()  # a hang fails on pytest's timeout
    _wait_for_no_prefetch_threads()
    settled = len(loaded)
    time.sleep(0.1)
    assert len(loaded) == settled  # nothing is loaded after the consumer left


@pytest.mark.parametrize("depth", [1, 3])
def test_close_with_a_slow_loader_finishes(depth):
    def load(i):
        time.sleep(0.02)
        return i

    gen = prefetch(range(1000), load, depth=depth)
    assert [next(gen) for _ in range(3)] == [0, 1, 2]
    gen.close()
    assert _prefetch_threads() == []  # close() returns only after the worker has stopped


@pytest.mark.parametrize("depth", [1, 3])
def test_consumer_exception_stops_the_worker(depth):
    with pytest.raises(RuntimeError, match="training step failed"):
        for value in prefetch(itertools.count(), lambda i: i, depth=depth):
            if value == 2:
                raise RuntimeError("training step failed")
    _wait_for_no_prefetch_threads()
