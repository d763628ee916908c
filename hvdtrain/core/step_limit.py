"""``train.max_steps``: a run that ends after a number of optimizer updates.

The limit counts updates as the optimizer-step counter does (a resumed run's included, whatever
world size ran them); the run ends at the limit or when ``train.epochs`` end, whichever comes
first. An epoch the limit falls inside is cut after the update that reaches it (:func:`cut`): the
loop then evaluates it, records it in ``metrics.jsonl`` (its ``step`` says where it stopped) and
checkpoints it as ``step-<N>`` at its position in the data (epochs completed, samples of the cut
epoch's order consumed, its running totals), like any step checkpoint. ``--resume`` with a larger
limit (or none) goes on from the next sample, and the cut epoch's row is followed by the whole
epoch's when that ends; resuming with the limit already reached trains nothing. hvdtrain's LR
schedule spans the updates the run takes (:func:`hvdtrain.core.schedule.build_schedule`), so its
decay ends at the limit; a task's own scheduler is the task's.
"""

from __future__ import annotations

from typing import Any


def reached(config: Any, step: int) -> bool:
    """Whether ``step`` updates have reached ``train.max_steps`` (never without a limit)."""
    limit = config.train.max_steps
    return limit is not None and step >= limit


def end_epoch(config: Any, position: Any, stopper: Any, gate: Any) -> int:
    """The epoch a run starting at ``position`` trains up to (exclusive): none when the early
    ``stopper`` has stopped it or the limit is already reached (said in one line), else
    ``train.epochs``."""
    if reached(config, position.step):
        gate.print(f"hvdtrain: train.max_steps={config.train.max_steps} already reached (optimizer step "
                   f"{position.step}): nothing to train; raise it to go on")
        return position.epoch
    return position.epoch if stopper and stopper.stopped else config.train.epochs


def cut(config: Any, batches: list, step: int, accumulation: int) -> tuple[list, bool]:
    """This epoch's micro-batches ``batches`` (``accumulation`` per update), up to the update that
    reaches ``train.max_steps`` from ``step`` updates; True when that cuts the epoch short."""
    limit = config.train.max_steps
    if limit is None or (limit - step) * accumulation >= len(batches):
        return batches, False
    return batches[:max(0, limit - step) * accumulation], True


def stop_line(config: Any, epoch: int, step: int, stopper: Any) -> str:
    """The line that says why the run stopped after epoch ``epoch`` (0-based) at update ``step``:
    the limit, else the early stopper's reason."""
    if reached(config, step):
        return (f"hvdtrain: stopped at train.max_steps={config.train.max_steps} (optimizer step {step}, in epoch "
                f"{epoch + 1} of {config.train.epochs}); a resume with a larger train.max_steps goes on from here")
    return f"hvdtrain: early stopping after epoch {epoch + 1} of {config.train.epochs}: {stopper.reason()}"
