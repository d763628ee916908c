"""A user's own training loop on hvdtrain's pieces (:func:`hvdtrain.torch.prepare`): what the config
means there, what stays a Trainer-only feature, and where the loop stands in its data.

The loop is the user's: hvdtrain does not run the forward pass, the loss, the schedule or the
evaluation, so the keys that configure those belong to the :class:`~hvdtrain.core.loop.Trainer`
and are refused when set (:func:`refusal`, one line naming the key), rather than silently ignored.
Everything that acts on the gradients, the state or the data order works as under the Trainer:
``comm.*`` (the exchange: allreduce, fp16, PowerSGD, top-k, local SGD, flat buffers, overlap),
``parallel.shard_optimizer`` (ZeRO-1/2), ``optim.grad_clip_norm``, ``train.nonfinite``,
``train.grad_accumulation``, ``train.seed``, ``train.batch_size``, ``data.shuffle``,
``data.remainder`` and ``checkpoint.*`` (``keep_last``, ``best_metric``); the rulebook
(:mod:`hvdtrain.core.rules`) refuses the same combinations as on the command line.

:class:`DataPosition` is the position in the data, as the Trainer keeps it: epochs completed, samples
of the current epoch's order consumed (all workers together) and optimizer updates taken. The
batches of an epoch come from :func:`hvdtrain.core.sharding.train_shard`, keyed by (seed, epoch,
consumed), so a resume continues at the next sample at any world size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hvdtrain.core import sharding
from hvdtrain.core.config import preempt_signal_names
from hvdtrain.core.resume import Position

RECIPE = "own-loop"  # what the manifest and config.yaml name as the recipe of an own-loop run

# (key, whether the config sets it, why it is the Trainer's): each is something the Trainer's loop does
TRAINER_ONLY: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("parallel.pipeline_stages", lambda c: c.parallel.pipeline_stages > 1,
     "the Trainer cuts the model into stages and runs each stage's forward and backward"),
    ("train.elastic", lambda c: c.train.elastic, "the Trainer re-forms the job and commits its state"),
    ("train.reproducible", lambda c: c.train.reproducible != "none",
     "the Trainer splits each update into the fixed micro-batches of the bitwise mode"),
    ("train.compile", lambda c: c.train.compile != "none", "compile your model with torch.compile in your script"),
    ("train.mixed_precision", lambda c: c.train.mixed_precision != "none",
     "the Trainer runs the forward pass; use torch.autocast (and a GradScaler for fp16) in your loop"),
    ("train.global_batch_size", lambda c: c.train.global_batch_size is not None,
     "the Trainer deals the micro-batches of a fixed global batch; set train.batch_size per worker"),
    ("train.max_steps", lambda c: c.train.max_steps is not None, "your loop decides when it stops"),
    ("train.early_stopping", lambda c: c.train.early_stopping is not None,
     "the Trainer evaluates and stops; your loop decides when it stops"),
    ("model.freeze_backbone_epochs", lambda c: c.model.freeze_backbone_epochs > 0,
     "the Trainer freezes the backbone per epoch; set requires_grad in your script"),
    ("optim.backbone_lr_factor", lambda c: c.optim.backbone_lr_factor != 1.0,
     "build the backbone's parameter group with its own LR in your optimizer"),
)


def signals_to_save_on(preempt_signals: str) -> str:
    """The signals a prepared loop opted in to ``save_on_signal`` watches: ``checkpoint.preempt_signals``
    (the Trainer's: Slurm's warning, SIGTERM) and SIGINT (Ctrl-C, which a user's own loop is run
    with at a terminal), as one ``preempt_signals`` value."""
    names = preempt_signal_names(preempt_signals)
    return ",".join(names + ([] if "INT" in names else ["INT"]))


def refusal(config: Any) -> str | None:
    """Why ``config`` cannot run in a user's own loop (one line naming the key), or None."""
    for key, is_set, why in TRAINER_ONLY:
        if is_set(config):
            section, name = key.split(".")
            value = getattr(getattr(config, section), name)
            return (f"{key}={value!r} is a Trainer-only setting ({why}); prepare() runs your own loop: "
                    f"leave {key} unset, or train through hvdtrain.Trainer / a recipe")
    return None


@dataclass
class DataPosition:
    """Where a worker stands in an epoch-based pass over ``num_samples`` samples, and the batches it
    trains on from there (``rank`` of ``size`` workers, ``batch_size`` per worker).

    Each ``iter()`` of the loader starts a pass (:meth:`plan`) at the position counted so far, as a
    ``DataLoader``'s ``iter()`` starts one. A batch handed out (:meth:`hand_out`) counts as consumed
    (:meth:`count`) once the loop comes back for the next batch, or an optimizer update is taken
    after it, or its pass ends: a pass started only to look at a batch (``next(iter(run.data))``)
    and abandoned consumes nothing, and a checkpoint written after the update on a batch resumes
    after it."""

    num_samples: int
    batch_size: int
    rank: int = 0
    size: int = 1
    seed: int = 0
    shuffle: bool = True
    remainder: str = "pad"
    drop_last: bool = False  # the last batch of the epoch is left out when it is short (DataLoader's drop_last)
    epoch: int = 0  # epochs completed
    consumed: int = 0  # samples of this epoch's order consumed, all workers together
    planned: list[np.ndarray] = field(default_factory=list)  # the batches of the pass under way
    taken: int = 0  # how many of them were handed out
    counted: int = 0  # how many of them count in ``consumed``
    passes: int = 0  # passes started: a pass that is no longer the newest hands out nothing more
    resumed: bool = False  # resumed inside an epoch, and no batch counted since (see :attr:`draws`)

    def plan(self) -> list[np.ndarray]:
        """The batches this worker trains on from the current position to the epoch's end (what
        :func:`hvdtrain.core.sharding.train_shard` deals from ``consumed`` on), and start that pass
        (the newest: an earlier pass's batches no longer count)."""
        indices = sharding.train_shard(self.num_samples, self.rank, self.size, self.epoch, self.seed,
                                       self.shuffle, self.remainder, start=self.consumed)
        batches = sharding.batches(indices, self.batch_size)
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches = batches[:-1]
        self.planned, self.taken, self.counted = batches, 0, 0
        self.passes += 1
        return batches

    def hand_out(self) -> None:
        """One more batch of the newest pass was handed out (it counts at :meth:`count`)."""
        self.taken += 1

    def count(self) -> None:
        """The batches of the newest pass handed out so far count as consumed (the loop came back for
        the next one, or an optimizer update used them)."""
        for batch in self.planned[self.counted:self.taken]:
            self.consumed += len(batch) * self.size
        if self.taken > self.counted:
            self.resumed = False
        self.counted = self.taken

    @property
    def draws(self) -> bool:
        """Whether a pass started now draws its ``DataLoader`` iterator's seed from the global random
        stream as a plain ``DataLoader`` does: not for a pass that continues a checkpoint inside an
        epoch (the run that wrote it drew that number when the epoch's first pass started, before
        the random state the checkpoint holds; drawing it again would shift every later dropout mask)."""
        return not self.resumed

    def end_epoch(self) -> None:
        """The pass reached the epoch's end: the next one starts the next epoch."""
        self.epoch, self.consumed, self.planned, self.taken, self.counted = self.epoch + 1, 0, [], 0, 0
        self.resumed = False

    def position(self, step: int) -> Position:
        """The position to checkpoint after optimizer update ``step``: an epoch whose every batch
        counts as consumed counts as completed."""
        if self.planned and self.counted >= len(self.planned):
            return Position(self.epoch + 1, 0, step)
        return Position(self.epoch, self.consumed, step)

    def resume_at(self, position: Position) -> None:
        """Continue at ``position`` (from a checkpoint, written at any world size)."""
        self.epoch, self.consumed, self.planned, self.taken, self.counted = position.epoch, position.consumed, [], 0, 0
        self.resumed = position.consumed > 0

    @property
    def epoch_samples(self) -> int:
        """The length of an epoch's order at this world size (the samples, padded or trimmed per
        ``remainder`` to a multiple of ``size``): a position at most this far into it is inside the data."""
        return sharding.shard_size(self.num_samples, self.size, self.remainder) * self.size

    def __len__(self) -> int:
        """Batches per epoch at this world size, from the epoch's start."""
        per_rank = sharding.shard_size(self.num_samples, self.size, self.remainder)
        full, rest = divmod(per_rank, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)
