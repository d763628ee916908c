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

With a fixed global batch (``train.global_batch_size``) a re-form changes only how the same updates
are shared: at every sync each worker's share is re-derived for the new world size
(:func:`hvdtrain.core.batching.reform_plan`; a world size that cannot share the global batch stops
the job on every worker, naming those that can) and the adapter starts a fresh accumulation window
of that many micro-batches (``restart_window``: what a window cut short had accumulated is
dropped), so the updates continue with the same samples and the same LR, bitwise in
``train.reproducible=world-size``. Which world size ran which updates is kept (broadcast with the
position) and an epoch's ``metrics.jsonl`` row names the ranges when it ran on more than one.

Where the run starts (the output check and lock, the ``--resume`` choice) is decided in the
state's sync, not before the loop: whoever is rank 0 at the first sync that completes plans and
broadcasts the decision, so a rank 0 lost before that leaves the decision to the next rank 0
(``--resume`` is not dropped), and a refusal raises the same error on every worker, which Horovod
reads as the job failing, not as one host to drop. A collective that fails inside the sync (a
worker lost there) is Horovod's recoverable error in both frameworks, as it is during training.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from hvdtrain.core import batching, faults, resume
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


def recoverable(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed collective (a lost worker) that TensorFlow raised as its own
    error: Horovod's elastic loop recovers only from its HorovodInternalError."""
    return any(marker in str(exc) for marker in COLLECTIVE_FAILURE_MARKERS)


def agree_on_start(trainer: Any, state: Any) -> None:
    """Every worker's part of the start decision in a sync (collectives: all call it). Rank 0 holds
    the output's lock (a worker that is no longer rank 0 lets it go first); until a sync has
    completed, rank 0 plans (:func:`resume.plan_start`), afterwards it re-sends the plan it
    follows. A refusal raises on every worker. A new plan is carried out at once (rank 0 restores
    its checkpoint into the model and ``state``); the caller commits it (``trainer.plan``) once the
    whole sync has succeeded, so a sync cut short by a lost worker plans again."""
    adapter, ctx, lock = trainer.adapter, trainer.ctx, trainer.lock
    if not ctx.is_main:
        lock.release()
    adapter.broadcast_object(None)  # distributed: the old holder has let go before rank 0 takes the lock

    def propose() -> dict[str, Any]:
        if trainer.plan is None:
            return {**resume.plan_start(trainer.config, trainer.manager, trainer.output, lock), "new": True}
        busy = lock.acquire()
        return {"error": busy} if busy else {**trainer.plan, "new": False}

    decision = resume.agree(adapter, ctx.is_main, propose)
    trainer.pending_plan = decision
    if not decision.get("new") or trainer.plan is not None:
        return  # a worker joining a run under way: the state comes by broadcast
    started = trainer.start(decision, collective=False)
    state.position, state.history, state.carried = started.position, started.history, None
    state.last_checkpoint = started.last_checkpoint


def restart_window(trainer: Any) -> None:
    """Every worker, at each sync: a fresh accumulation window of this world size's share of an
    update (:func:`hvdtrain.core.batching.reform_plan`), said on rank 0 when a fixed global batch's
    share changed."""
    adapter, ctx, train = trainer.adapter, trainer.ctx, trainer.config.train
    plan = batching.reform_plan(train, ctx.data_size)
    if plan.global_batch is not None and plan.accumulation != adapter.accumulation:
        trainer.gate.print(f"hvdtrain: elastic: train.global_batch_size={plan.global_batch} on {ctx.data_size} "
                           f"worker(s): each accumulates {plan.accumulation} micro-batch(es) of "
                           f"{plan.micro_batch} per update (the same updates continue)")
    adapter.restart_window(plan.accumulation)


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
            batching.reform_plan(trainer.config.train, trainer.ctx.data_size)  # every worker alike: a world size
            # that cannot share a fixed global batch stops the job here, before any collective
            faults.at_first_sync(trainer.ctx.rank)  # HVDTRAIN_FAULT=kill-at-sync: a worker lost right here
            try:
                with trainer.watchdog.phase("an elastic join: waiting for every worker, new ones included"):
                    agree_on_start(trainer, state)  # distributed: where the run starts, on every rank
                    adapter.broadcast_state(root_rank=0)  # distributed: new and old workers start from rank 0
                    where = trainer.checks.workers(adapter)  # a joining host with other versions is named here
                    if where:
                        trainer.gate.print(where)
                    state.position, state.history, sizes = adapter.broadcast_object(
                        (state.position, state.history, trainer.world_sizes))
            except HorovodInternalError:
                raise
            except Exception as exc:  # TensorFlow's error for a collective a lost worker left unfinished
                if recoverable(exc):
                    raise HorovodInternalError(exc) from exc
                raise
            trainer.plan = {k: v for k, v in trainer.pending_plan.items() if k != "new"}  # agreed by every rank
            trainer.world_sizes = batching.note_world_size(sizes, state.position.step + 1, trainer.ctx.size)
            restart_window(trainer)
            trainer.announce_start()  # rank 0: config.yaml (again after a re-form: the same), the lock's holder
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
            if recoverable(exc):
                raise HorovodInternalError(exc) from exc
            raise

    trainer.plan = None  # no start agreed yet: the first sync that completes decides it
    trainer.world_sizes = []  # (first update, world size) of each range of updates, from the first sync
    elastic_state = ElasticTrainingState()
    def reset() -> None:
        with trainer.watchdog.phase("an elastic join: Horovod re-forms the job"):
            adapter.elastic_reset()

    return run_fn(guarded, reset)(elastic_state)
