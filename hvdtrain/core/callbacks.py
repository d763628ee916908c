"""Training hooks: progress, logging, the watchdog, fault injection and export plug in here
instead of into the loop.

The :class:`~hvdtrain.core.loop.Trainer` calls every callback on every rank, in order; a callback
that writes files or prints checks ``ctx.is_main`` (set in :meth:`Callback.on_train_begin`, which
an elastic job calls again, with the new context, each time the job re-forms). A callback must not
call collectives: ranks may run different callbacks.
"""

from __future__ import annotations

from typing import Any


class Callback:
    """Base class with no-op hooks; override the ones you need."""

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        """Before the first step. ``info``: config, output, start_epoch, steps_per_epoch, world_size."""

    def on_step_begin(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        """Before every micro-batch's train step. ``logs``: ``global_step`` (optimizer steps taken),
        ``weight`` (this micro-batch's share of its accumulation window's loss; a callback may
        replace it, as the injected NaN fault does)."""

    def on_step_end(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        """After every micro-batch. ``logs``: ``loss`` (this rank), ``lr``, ``global_step``,
        ``samples`` (this rank, this epoch), ``samples_per_sec`` (estimated global), ``steps`` (per epoch)."""

    def on_epoch_end(self, epoch: int, record: dict[str, Any]) -> None:
        """After evaluation and the checkpoint; ``record`` is the line written to metrics.jsonl."""

    def on_train_end(self, result: Any) -> None:
        """After the last epoch, with the :class:`~hvdtrain.core.loop.RunResult`."""


class CallbackList(Callback):
    """Calls each hook on every callback in order."""

    def __init__(self, callbacks: list[Callback] | tuple[Callback, ...] = ()):
        self.callbacks = list(callbacks)

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_train_begin(ctx, info)

    def on_step_begin(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_step_begin(epoch, step, logs)

    def on_step_end(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_step_end(epoch, step, logs)

    def on_epoch_end(self, epoch: int, record: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_epoch_end(epoch, record)

    def on_train_end(self, result: Any) -> None:
        for cb in self.callbacks:
            cb.on_train_end(result)
