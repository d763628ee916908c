"""Data as users have it: one wrapper turns a task's train or validation data into the loop's source.

The loop reads random-access data (:class:`hvdtrain.core.task.Dataset`): ``len()`` samples and
``get_batch(indices, epoch)`` -> NumPy ``(inputs, targets)``. :func:`as_source` accepts, for
``TrainTask.train_data`` and ``val_data``:

* an object with ``get_batch`` and ``__len__`` (:class:`~hvdtrain.core.task.ArrayDataset`, the
  recipes' pipelines): used as it is;
* a Hugging Face ``datasets.Dataset`` (recognised by ``column_names`` and ``with_format``): read a
  batch at a time, chosen columns (:class:`ColumnSource`);
* a stream, a torch ``IterableDataset`` or an unbatched, finite ``tf.data.Dataset``: read once into
  memory on every rank, sample ``i`` being its ``i``-th element (:mod:`hvdtrain.core.streams`: what
  resume means for it, the memory limit);
* a map-style dataset, ``torch.utils.data.Dataset`` and anything else with ``__len__`` and integer
  ``__getitem__``: items collated into batches the way torch's ``default_collate`` does, nested
  dicts, tuples and lists included, as NumPy (:class:`MapSource`).

Map-style and Hugging Face sources are read in ``data.workers`` worker processes
(:mod:`hvdtrain.core.item_workers`: the same batches, in order), streams by the loop's thread. An
item whose ``__getitem__`` raises is named by index (:class:`ItemError`).

An item is ``(inputs, target)``, or a mapping of columns with a target column (``label``/``labels``,
or the one named). Every random-access source keeps the loop's guarantees: the order comes from
``(train.seed, epoch)`` and the position in it, so a resume is exact at any world size. Anything
else is refused when the task is built, in one line naming what is accepted: a batched
``tf.data.Dataset`` (whose ``len()`` counts batches: pass it before ``.batch()``), one that never
ends (``.repeat()``), a generator, a DataLoader (pass its ``.dataset``). No framework is imported here: torch tensors become NumPy through ``__array__``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hvdtrain.core import streams
from hvdtrain.core.config import ConfigError
from hvdtrain.core.errors import type_name

ACCEPTED = ("an object with get_batch(indices, epoch) and len() (hvdtrain.ArrayDataset), a map-style "
            "torch.utils.data.Dataset (len() and integer indexing), a Hugging Face datasets.Dataset, or a stream "
            "read into memory (a torch IterableDataset, an unbatched tf.data.Dataset)")
TARGET_KEYS = ("label", "labels")


class SourceError(ConfigError):
    """A task's data is not a kind the loop can read (one line naming what is accepted)."""


class ItemError(RuntimeError):
    """An item's ``__getitem__`` raised: the message names the data and the index."""


def _stream(data: Any, field: str) -> tuple[str | None, str | None]:
    """``(what, refusal)``: ``what`` names a stream :func:`hvdtrain.core.streams.read` reads
    (a torch ``IterableDataset``, an unbatched, finite ``tf.data.Dataset``), ``refusal`` says why a
    tf.data pipeline cannot be one; both None for anything else."""
    if type(data).__module__.startswith("tensorflow") and hasattr(data, "element_spec"):
        shapes = [getattr(s, "shape", None) for s in _flat(data.element_spec)]
        if any(shape is not None and shape.rank and shape[0] is None for shape in shapes):
            return None, (f"TrainTask.{field}: a tf.data.Dataset and batched: its len() counts batches, not samples; "
                          f"pass it before .batch() (or call .unbatch()): hvdtrain batches with train.batch_size")
        if int(data.cardinality()) == -1:  # tf.data.INFINITE_CARDINALITY
            return None, (f"TrainTask.{field}: a tf.data.Dataset that never ends (.repeat()); pass it without "
                          f".repeat(): hvdtrain makes the epochs (train.epochs, train.max_steps)")
        return "a tf.data.Dataset", None
    if "IterableDataset" in {c.__name__ for c in type(data).__mro__}:
        return type_name(data), None
    return None, None


def _refusal(data: Any, field: str) -> str | None:
    """Why ``data`` cannot be a source, or None."""
    names = {c.__name__ for c in type(data).__mro__}
    if "DataLoader" in names and hasattr(data, "dataset"):
        return (f"TrainTask.{field}: {type_name(data)} batches and shuffles itself; pass its dataset "
                f"(loader.dataset): hvdtrain shards, orders and batches it. Accepted: {ACCEPTED}")
    if not hasattr(data, "__len__") or not (hasattr(data, "get_batch") or hasattr(data, "__getitem__")) \
            or isinstance(data, (str, bytes, Mapping)):
        return f"TrainTask.{field}: {type_name(data)} is not a dataset; accepted: {ACCEPTED}"
    return None


def _flat(spec: Any) -> list[Any]:
    if isinstance(spec, Mapping):
        return [s for v in spec.values() for s in _flat(v)]
    if isinstance(spec, (tuple, list)):
        return [s for v in spec for s in _flat(v)]
    return [spec]


def as_source(data: Any, field: str = "train_data", inputs: Sequence[str] | None = None,
              target: str | None = None) -> Any:
    """``data`` as a random-access source the loop reads (see the module docstring), or
    :class:`SourceError` naming ``TrainTask.<field>`` and what is accepted. ``inputs`` and
    ``target`` choose the columns of mapping items (default: the ``label``/``labels`` column is the
    target, the other columns the inputs)."""
    what, problem = _stream(data, field)
    if problem:
        raise SourceError(f"{problem}. Accepted: {ACCEPTED}")
    if what:
        try:
            return StreamSource(streams.read(data, field, what), field, inputs, target)
        except SourceError:
            raise
        except ConfigError as exc:  # too large, or empty
            raise SourceError(str(exc)) from None
    problem = _refusal(data, field)
    if problem:
        raise SourceError(problem)
    if hasattr(data, "get_batch"):
        return data
    if hasattr(data, "column_names") and hasattr(data, "with_format"):
        return ColumnSource(data, field, inputs, target)
    return MapSource(data, field, inputs, target)


def collate(items: list[Any]) -> Any:
    """Items into one batch as torch's ``default_collate`` does, in NumPy: arrays and tensors
    stacked, numbers into an array (int64, float64, bool), strings kept as a list, mappings by key,
    tuples and lists element by element (nested)."""
    first = items[0]
    if isinstance(first, (str, bytes)):
        return list(items)
    if isinstance(first, Mapping):
        return {key: collate([item[key] for item in items]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a named tuple stays one
        return type(first)(*(collate(list(column)) for column in zip(*items)))
    if isinstance(first, (tuple, list)):
        if any(len(item) != len(first) for item in items):
            raise ValueError("items of one batch have sequences of different lengths")
        return [collate(list(column)) for column in zip(*items)]
    if isinstance(first, bool):
        return np.asarray(items, dtype=np.bool_)
    if isinstance(first, int):
        return np.asarray(items, dtype=np.int64)
    if isinstance(first, float):
        return np.asarray(items, dtype=np.float64)
    return np.stack([np.asarray(item) for item in items])


def _split(batch: Any, field: str, inputs: Sequence[str] | None, target: str | None) -> tuple[Any, Any]:
    """A collated batch as ``(inputs, targets)``."""
    if isinstance(batch, Mapping):
        name = target or next((k for k in TARGET_KEYS if k in batch), None)
        if name is None or name not in batch:
            raise SourceError(f"TrainTask.{field}: items are mappings with keys {sorted(batch)} and no target "
                              f"column {target or ' or '.join(TARGET_KEYS)}; name it: "
                              f"hvdtrain.as_source(data, target=KEY)")
        keys = list(inputs) if inputs is not None else [k for k in batch if k != name]
        missing = [k for k in keys if k not in batch]
        if missing:
            raise SourceError(f"TrainTask.{field}: input columns {missing} are not in the items' keys {sorted(batch)}")
        return {k: batch[k] for k in keys}, np.asarray(batch[name])
    if isinstance(batch, list) and len(batch) == 2:
        return batch[0], np.asarray(batch[1])
    raise SourceError(f"TrainTask.{field}: an item must be (inputs, target) or a mapping with a target column; "
                      f"got {len(batch) if isinstance(batch, list) else type(batch).__name__} parts")


class MapSource:
    """A map-style dataset (``len()`` and ``dataset[i]``) read item by item and collated, in worker
    processes (``in_workers``: :mod:`hvdtrain.core.item_workers`) or by the loop's thread."""

    in_workers = True
    before_item = None  # in a worker: seeds the global random generators from (seed, epoch, index)

    def __init__(self, dataset: Any, field: str = "train_data", inputs: Sequence[str] | None = None,
                 target: str | None = None) -> None:
        self.source, self.field, self.inputs, self.target = dataset, field, inputs, target

    def __len__(self) -> int:
        return len(self.source)

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[Any, np.ndarray]:
        """The items at ``indices``, collated, as ``(inputs, targets)``; :class:`ItemError` names an
        item whose ``__getitem__`` raised."""
        items = []
        for i in indices:
            if self.before_item is not None:
                self.before_item(epoch, int(i))
            try:
                items.append(self.source[int(i)])
            except Exception as exc:
                raise ItemError(f"TrainTask.{self.field}[{int(i)}]: {type_name(self.source)}.__getitem__({int(i)}) "
                                f"raised {type(exc).__name__}: {exc}") from exc
        return _split(collate(items), self.field, self.inputs, self.target)


class ColumnSource:
    """A Hugging Face ``datasets.Dataset``: one batched read per batch (NumPy format), chosen columns,
    in worker processes (``in_workers``) or by the loop's thread."""

    in_workers = True

    def __init__(self, dataset: Any, field: str = "train_data", inputs: Sequence[str] | None = None,
                 target: str | None = None) -> None:
        self.source, self.field, self.inputs, self.target = dataset, field, inputs, target
        columns = list(inputs or ()) + ([target] if target else [])
        missing = [c for c in columns if c not in dataset.column_names]
        if missing:
            raise SourceError(f"TrainTask.{field}: columns {missing} are not in the dataset's columns "
                              f"{dataset.column_names}")
        self.table = dataset.with_format("numpy")

    def __len__(self) -> int:
        return len(self.source)

    def get_batch(self, indices: np.ndarray, epoch: int) -> tuple[Any, np.ndarray]:
        """Rows ``indices`` as ``(inputs, targets)``: a dict of NumPy columns and the target column."""
        rows = self.table[[int(i) for i in indices]]
        return _split({k: np.asarray(v) for k, v in rows.items()}, self.field, self.inputs, self.target)


class StreamSource(MapSource):
    """A stream's elements (:func:`hvdtrain.core.streams.read`) in the order it yielded them, read as a
    map-style source; ``fingerprint()`` hashes their content (the start-up data check compares it
    across ranks). Read by the loop's thread: its items are already in memory (a worker would copy them)."""

    in_workers = False

    def fingerprint(self) -> str:
        """A content hash of the elements in order."""
        return streams.fingerprint(self.source)
