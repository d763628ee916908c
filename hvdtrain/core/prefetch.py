"""Background batch preparation: decode and augment the next batches while the current one trains.

:func:`load_batches` is how the loop reads a source's batches: in ``data.workers`` processes for the
sources that allow it (map-style and Hugging Face sources: :mod:`hvdtrain.core.item_workers`),
otherwise by one background thread (:func:`prefetch`); either way in the order given.
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any, Callable, Iterable, Iterator


def load_batches(source: Any, batches: list[Any], epoch: int, config: Any, ctx: Any,
                 convert: Callable[[Any, Any], tuple[Any, Any]] | None = None) -> Iterator[Any]:
    """``source.get_batch(indices, epoch)`` for each of ``batches``, in order, read ahead by
    ``data.workers`` processes (``source.in_workers``; None: :func:`~hvdtrain.core.item_workers.default_workers`)
    or by the prefetch thread, ``data.prefetch_batches`` batches ahead. ``convert(inputs, targets)``
    (the adapter's ``convert_batch``) turns each batch into what the steps take: in the prefetch
    thread, or as the data workers' batches arrive."""
    depth, loaded = config.data.prefetch_batches, None
    if getattr(source, "in_workers", False):
        from hvdtrain.core import item_workers

        workers = config.data.workers
        workers = item_workers.default_workers(ctx.local_size) if workers is None else workers

        def say(line: str, warning: bool) -> None:
            if ctx.rank == 0:
                print(f"hvdtrain: {'warning: ' if warning else ''}{line}", file=sys.stderr if warning else sys.stdout,
                      flush=True)

        loaded = item_workers.batches(source, batches, epoch, depth, workers, config.train.seed, say)
    if loaded is None:
        if convert is None:
            return prefetch(batches, lambda idx: source.get_batch(idx, epoch), depth)
        return prefetch(batches, lambda idx: convert(*source.get_batch(idx, epoch)), depth)
    return loaded if convert is None else (convert(*batch) for batch in loaded)


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
