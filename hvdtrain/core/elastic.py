"""Horovod elastic training (``--elastic``) for both frameworks, through the adapter.

Horovod's elastic state classes are per framework, and its TensorFlow one targets Keras 2; here
one state class serves both: the adapter takes an in-memory snapshot of model and optimizer
(``snapshot``/``restore_snapshot``) and broadcasts them (``broadcast_state``). The loop commits
the state every ``train.elastic_commit_every`` optimizer steps and at every epoch end. When a
worker dies, the survivors roll back to the last commit, Horovod re-forms the job without it, the
state is broadcast from the new rank 0, and training continues at the committed position with
the rest of the epoch resharded over the new world size. The LR is the schedule's value for
the samples seen, with the peak scaled for the new global batch (the schedule follows the position
in the data, not the optimizer-step counter). When a host comes
back, the next commit notices, the job re-forms with it, and it receives the state. Samples
between the last commit and a failure are trained again; none are skipped. :func:`commit_due`
is the commit cadence.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from hvdtrain.tools.hosts import describe_workers
from hvdtrain.core.rank0 import RankZeroGate

# A failed collective inside a tf.function surfaces as TensorFlow's UnknownError with one of these
# in its message, not as Horovod's HorovodInternalError (which Horovod's elastic loop expects).
COLLECTIVE_FAILURE_MARKERS = ("HorovodAllreduce", "HorovodAllgather", "HorovodBroadcast", "Horovod has been shut down")


def commit_due(config: Any, step: int, applied: bool, checkpointed: bool) -> bool:
    """Whether to commit after this micro-batch (optimizer step ``step``): in elastic mode, after an
    update, every ``train.elastic_commit_every`` steps and at every checkpoint too, so a rollback
    never replays past a written one."""
    return bool(applied and config.train.elastic
                and (checkpointed or step % config.train.elastic_commit_every == 0))


def run_elastic(trainer: Any, body: Callable[[Any], Any], state: Any) -> Any:
    """Run ``body(state)`` under Horovod's elastic driver with ``state`` committed and restored."""
    from horovod.common.elastic import State, run_fn  # only elastic runs need Horovod's elastic layer
    from horovod.common.exceptions import HorovodInternalError

    adapter = trainer.adapter

    class ElasticTrainingState(State):
        """Model, optimizer, position and history, committed to host memory."""

        def __init__(self) -> None:
            super().__init__(bcast_object=adapter.broadcast_object, get_rank=lambda: trainer.ctx.rank)
            self.inner = state
            self.save()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.__dict__["inner"], name)

        def __setattr__(self, name: str, value: Any) -> None:
            if name in ("position", "history", "carried", "last_checkpoint"):
                setattr(self.inner, name, value)
            else:
                super().__setattr__(name, value)

        def save(self) -> None:
            self._snapshot = adapter.snapshot()
            self._saved = copy.deepcopy((state.position, state.history, state.carried))

        def restore(self) -> None:
            adapter.restore_snapshot(self._snapshot)
            state.position, state.history, state.carried = copy.deepcopy(self._saved)

        def sync(self) -> None:
            trainer.watchdog.beat(state.position.step, "waiting in collectives (elastic state broadcast)")
            with trainer.watchdog.phase("an elastic join: waiting for every worker, new ones included"):
                adapter.broadcast_state(root_rank=0)  # distributed: new and old workers start from rank 0
                where = describe_workers(adapter)  # a joining host with other versions is named here
                if where:
                    trainer.gate.print(where)
                state.position, state.history = adapter.broadcast_object((state.position, state.history))
            state.carried = None  # partial training-loss sums are per rank; restart them
            trainer._reseed(state.position)  # every rank its own dropout stream again
            self.save()

        def reset(self) -> None:
            trainer.ctx = adapter.context()
            trainer.gate = RankZeroGate(trainer.ctx.rank)
            trainer.gate.print(f"hvdtrain: elastic: the job re-formed with {trainer.ctx.size} worker(s); "
                               f"continuing at epoch {state.position.epoch + 1}, after {state.position.consumed} "
                               f"samples")

    trainer.watchdog.beat(state.position.step, "joining Horovod's elastic driver")
    def guarded(elastic_state: Any) -> Any:
        try:
            return body(elastic_state)
        except HorovodInternalError:
            raise
        except Exception as exc:
            if any(marker in str(exc) for marker in COLLECTIVE_FAILURE_MARKERS):
                raise HorovodInternalError(exc) from exc
            raise

    elastic_state = ElasticTrainingState()
    def reset() -> None:
        with trainer.watchdog.phase("an elastic join: Horovod re-forms the job"):
            adapter.elastic_reset()

    return run_fn(guarded, reset)(elastic_state)
