"""A training ``DataLoader`` that knows where it stands: each worker's batches of the epoch dealt by
(seed, epoch, samples consumed) (:class:`hvdtrain.core.own_loop.DataPosition`), so a loop resumed
from a checkpoint continues at the next sample, at any world size. What :func:`hvdtrain.torch.prepare`
hands back for the ``data`` it was given; it replaces ``DistributedSampler`` and ``set_epoch``.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator

import torch
from torch.utils.data import (BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler, SequentialSampler,
                              TensorDataset)

from hvdtrain.core.config import ConfigError
from hvdtrain.core.errors import type_name
from hvdtrain.core.own_loop import DataPosition
from hvdtrain.core.resume import Position

# the DataLoader settings a wrapped loader keeps (everything but how it samples and batches)
KEPT = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
        "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")


def loader_facts(data: Any) -> tuple[Dataset, int | None, bool | None, bool, dict[str, Any]]:
    """``(dataset, batch_size, shuffle, drop_last, settings)`` of a map-style ``Dataset`` (the sizes
    left to the config: None) or of a ``DataLoader`` built on one with its default sampling
    (``shuffle=True`` or not); anything else is refused in one line naming what it is."""
    if isinstance(data, DataLoader):
        dataset = data.dataset
        custom = not isinstance(data.sampler, (SequentialSampler, RandomSampler)) or \
            type(data.batch_sampler) is not BatchSampler
        if isinstance(dataset, IterableDataset) or custom or data.batch_size is None:
            raise ConfigError(f"data: a DataLoader with {_sampling(data)} has no position to resume at; pass a "
                              f"map-style Dataset, or a DataLoader(dataset, batch_size=N, shuffle=True|False)")
        settings = {name: getattr(data, name) for name in KEPT if hasattr(data, name)}
        if settings.get("num_workers", 0) == 0:
            settings.pop("prefetch_factor", None)  # DataLoader refuses it without workers
            settings["persistent_workers"] = False
        return dataset, data.batch_size, isinstance(data.sampler, RandomSampler), data.drop_last, settings
    if isinstance(data, IterableDataset) or not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        raise ConfigError(f"data: {type_name(data)} is not a map-style dataset (len() and dataset[i]) nor a "
                          f"DataLoader over one; an iterable has no position to resume at")
    return data, None, None, False, {}


def _sampling(loader: DataLoader) -> str:
    if isinstance(loader.dataset, IterableDataset):
        return f"an IterableDataset ({type_name(loader.dataset)})"
    if loader.batch_size is None:
        return "batch_size=None"
    custom = loader.sampler if not isinstance(loader.sampler, (SequentialSampler, RandomSampler)) else loader.batch_sampler
    return f"its own sampler ({type_name(custom)})"


class _Planned(torch.utils.data.Sampler):
    """The batch sampler of the wrapped ``DataLoader``: the batches of the pass under way."""

    def __init__(self, position: DataPosition) -> None:
        self.position = position

    def __iter__(self) -> Iterator[list[int]]:
        return (batch.tolist() for batch in self.position.planned)

    def __len__(self) -> int:
        return len(self.position.planned)


class PositionedLoader:
    """Iterate it once per epoch as a ``DataLoader``: this worker's batches of the epoch from the
    current position. Each ``iter()`` starts a pass there, as a ``DataLoader``'s does; a batch counts
    as consumed once the loop comes back for the next one or an optimizer update is taken after it
    (:class:`~hvdtrain.core.own_loop.DataPosition`), so a batch looked at with ``next(iter(loader))``
    and left is trained by the next ``for`` loop, and a checkpoint written after the update on a
    batch resumes after it. A pass that runs to its end completes the epoch; one stopped early
    (``break``) continues after its last counted batch at the next ``iter()``. Only the newest pass
    hands out batches: an earlier iterator stops.

    The global random stream is drawn as by a plain ``DataLoader`` (one number per ``iter()``, the
    iterator's seed), except by the pass that continues a checkpoint inside an epoch: the run that
    wrote it drew that number before its saved random state, so the resumed run's dropout masks are
    the uninterrupted run's, bit for bit.

    ``position`` (:class:`~hvdtrain.core.own_loop.DataPosition`) is what a checkpoint records;
    ``len()`` is the number of batches of a whole epoch on this worker."""

    def __init__(self, dataset: Dataset, position: DataPosition, settings: dict[str, Any] | None = None) -> None:
        self.dataset, self.position = dataset, position
        self.loader = DataLoader(dataset, batch_sampler=_Planned(position), **(settings or {}))

    @property
    def epoch(self) -> int:
        """Epochs completed (the next pass trains epoch ``epoch``, counted from 0)."""
        return self.position.epoch

    def set_epoch(self, epoch: int) -> None:
        """``DistributedSampler.set_epoch``'s place, for loops that call it: a no-op when ``epoch``
        is the epoch under way; another epoch starts that epoch from its first sample."""
        if epoch != self.position.epoch:
            self.position.resume_at(Position(int(epoch), 0, 0))

    def __iter__(self) -> Iterator[Any]:
        position = self.position
        if not position.plan():  # resumed exactly at the epoch's end
            position.end_epoch()
            return iter(())
        if position.draws or self.loader.generator is not None:
            batches = iter(self.loader)
        else:  # continuing a checkpoint: the seed this iterator draws was drawn before the saved state
            state = torch.get_rng_state()
            batches = iter(self.loader)
            torch.set_rng_state(state)
        return self._pass(batches, position.passes)

    def _pass(self, batches: Iterator[Any], number: int) -> Iterator[Any]:
        position = self.position
        for batch in batches:
            if position.passes != number:  # a newer iter() took over
                return
            position.count()  # the loop came back: the batch before this one was used
            position.hand_out()
            yield batch
        if position.passes == number:
            position.count()
            position.end_epoch()

    def facts(self) -> dict[str, Any]:
        """What a checkpoint's manifest records of the data: its length, its type and, for a
        ``TensorDataset``, a cheap fingerprint (the tensors' shapes and dtypes and a CRC of their
        first and last rows)."""
        facts: dict[str, Any] = {"samples": len(self.dataset), "type": type_name(self.dataset)}
        if isinstance(self.dataset, TensorDataset) and len(self.dataset):
            crc = 0
            for tensor in self.dataset.tensors:
                for row in (tensor[0], tensor[-1]):
                    # its bytes through a uint8 view: NumPy has no bfloat16 (the same bytes as .numpy() otherwise)
                    crc = zlib.crc32(row.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes(), crc)
            facts["fingerprint"] = {"tensors": [[list(t.shape), str(t.dtype)] for t in self.dataset.tensors],
                                    "crc32": crc}
        return facts

    def __len__(self) -> int:
        return len(self.position)
