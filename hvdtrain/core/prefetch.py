"""Background batch preparation: decode and augment the next batches while the current one trains."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterable, Iterator


def prefetch(items: Iterable[Any], load: Callable[[Any], Any], depth: int = 2) -> Iterator[Any]:
    """Yield ``load(item)`` for each item, computed up to ``depth`` items ahead in a thread.

    An exception in ``load`` is re-raised in the caller at the position it happened.
    ``depth=0`` loads inline.
    """
    if depth <= 0:
        for item in items:
            yield load(item)
        return
    buffer: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def worker() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                buffer.put((True, load(item)))
        except BaseException as exc:  # handed to the consumer
            buffer.put((False, exc))
            return
        buffer.put((True, done))

    thread = threading.Thread(target=worker, name="hvdtrain-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            ok, value = buffer.get()
            if not ok:
                raise value
            if value is done:
                return
            yield value
    finally:
        stop.set()
        while thread.is_alive():
            try:
                buffer.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)
