"""Iterable sources read once into memory: a torch ``IterableDataset`` or an unbatched ``tf.data.Dataset``.

The loop reads random access (the order from ``(train.seed, epoch)``, a resume exact at any world
size). A stream has no index, so :func:`read` gives it one: every rank reads the whole
stream once, when the task is built (as Accelerate's ``IterableDatasetShard`` does, where every
process iterates all of it and keeps its share), and sample ``i`` is the ``i``-th element it
yielded (:class:`hvdtrain.core.sources.StreamSource`). From there it is a map-style source with
every guarantee of one, provided the stream yields the same elements in the same order on every
rank and in every run (a fixed seed for any shuffle of its own). Resume: a checkpoint holds a
position in the ``(train.seed, epoch)`` order of these indices, not in the stream; ``--resume``
reads the stream again from its start and goes on at the next sample, at the same or another
world size (nothing is refused). A stream that yields other elements than in the run that wrote
the checkpoint is not detected (the data check compares ranks, not runs). The elements are read
by the loop's thread, not by data workers: they are in memory already. Ranks that read different elements (a stream sharded by the user with
``ds.shard(size, rank)``, an unseeded shuffle) are refused at start-up by the data check, which
compares the fingerprint (:func:`fingerprint`, by value) across ranks. A stream must end and
fit in memory: ``data.stream_max_gib`` (default 4, :data:`LIMIT_BYTES`), counted as it is read in
Python's object sizes (:func:`held_bytes`: containers, scalars and array headers included), and
``data.stream_max_elements`` (default 50 million, :data:`LIMIT_ELEMENTS`: a stream of tiny
elements that never ends is refused too); larger data, or data that never ends, is refused in one
line naming the bound, its key and the alternatives: a map-style ``Dataset``, a Hugging Face
``datasets.Dataset`` (memory-mapped Arrow), or the image pipeline's shards.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from hvdtrain.core.config import ConfigError

LIMIT_BYTES = 4 * 2**30  # what a stream may hold in memory on each rank (data.stream_max_gib)
LIMIT_ELEMENTS = 50_000_000  # how many elements (data.stream_max_elements): an endless stream of tiny ones ends
SLOT_BYTES = 8  # the list's pointer to each element, counted with the element
BYTES_KEY, ELEMENTS_KEY = "data.stream_max_gib", "data.stream_max_elements"
_LIMITS: list[tuple[int, int]] = []  # the running trainer's (bytes, elements), innermost last
ALTERNATIVES = ("for data that does not fit, give a map-style torch.utils.data.Dataset, a Hugging Face "
                "datasets.Dataset (memory-mapped), or shards for the image pipeline (docs: guides/data)")


@contextmanager
def limits(max_gib: float | None, max_elements: int | None) -> Iterator[None]:
    """While the recipe builds its task: :func:`read` bounds streams by ``max_gib`` GiB and
    ``max_elements`` elements (the run's ``data.stream_max_gib``/``data.stream_max_elements``;
    None: the default, :data:`LIMIT_BYTES`, :data:`LIMIT_ELEMENTS`)."""
    _LIMITS.append((LIMIT_BYTES if max_gib is None else int(max_gib * 2**30),
                    LIMIT_ELEMENTS if max_elements is None else int(max_elements)))
    try:
        yield
    finally:
        _LIMITS.pop()


def _current_limits() -> tuple[int, int]:
    return _LIMITS[-1] if _LIMITS else (LIMIT_BYTES, LIMIT_ELEMENTS)


_SCALARS = (str, bytes, bytearray, int, float, complex, bool, type(None), np.generic)


def held_bytes(item: Any) -> int:
    """The memory an element holds, as Python counts it: ``sys.getsizeof`` of every container, key
    and scalar (their object headers included: a ``(int, int)`` tuple is about 110 bytes, not the
    16 of its numbers), an array's data and header, and a tensor's data (NumPy's view of it) plus
    its object. Shared small objects (``None``, small ints) are counted at every use: the count
    errs high, never low."""
    if isinstance(item, Mapping):
        return sys.getsizeof(item) + sum(held_bytes(k) + held_bytes(v) for k, v in item.items())
    if isinstance(item, (tuple, list)):
        return sys.getsizeof(item) + sum(held_bytes(v) for v in item)
    if isinstance(item, _SCALARS):
        return sys.getsizeof(item)
    if isinstance(item, np.ndarray):  # an array that owns its data counts it in getsizeof; a view does not
        return sys.getsizeof(item) + (0 if item.base is None else item.nbytes)
    try:
        data = np.asarray(item).nbytes  # a torch tensor, a tf tensor: their data
    except Exception:  # noqa: BLE001  (an object NumPy cannot view: its own size only)
        data = 0
    return sys.getsizeof(item) + data


def read(data: Any, field: str, what: str) -> list[Any]:
    """The elements of stream ``data`` (``what`` names it in messages) in the order it yields them;
    :class:`~hvdtrain.core.config.ConfigError` when it holds nothing, or more memory (counted by
    :func:`held_bytes`, with the list's slot per element) or more elements than the run's bounds
    (:func:`limits`; default :data:`LIMIT_BYTES`, :data:`LIMIT_ELEMENTS`): one line naming the bound
    and the key that raises it. A stream that never ends is refused at the first bound it meets."""
    max_bytes, max_elements = _current_limits()
    elements = data.as_numpy_iterator() if hasattr(data, "as_numpy_iterator") else iter(data)
    items: list[Any] = []
    held = 0
    for item in elements:
        if len(items) >= max_elements:
            raise ConfigError(f"TrainTask.{field}: {what} yields more than {max_elements:,} elements "
                              f"({ELEMENTS_KEY}={max_elements}; raise it for a longer stream, which must end); "
                              f"hvdtrain reads a stream into memory on every rank to give it random access; "
                              f"{ALTERNATIVES}")
        held += held_bytes(item) + SLOT_BYTES
        if held > max_bytes:
            raise ConfigError(f"TrainTask.{field}: {what} holds more than {max_bytes / 2**30:g} GiB after "
                              f"{len(items):,} elements ({BYTES_KEY}={max_bytes / 2**30:g}, counted with Python's "
                              f"object sizes; raise it if the memory is there); hvdtrain reads a stream into "
                              f"memory on every rank to give it random access; {ALTERNATIVES}")
        items.append(item)
    if not items:
        raise ConfigError(f"TrainTask.{field}: {what} yielded no elements")
    return items


def _encode(value: Any, digest: Any) -> None:
    """Feed ``value`` to ``digest`` by value, tagged by kind (None, bool, int, float, str, bytes,
    mappings with their keys, sequences, arrays by dtype, shape and bytes, object arrays element by
    element, other objects by type and attributes): equal values give equal bytes in any process."""
    def put(tag: bytes, payload: bytes = b"") -> None:
        digest.update(tag + len(payload).to_bytes(8, "little") + payload)

    if value is None:
        put(b"N")
    elif isinstance(value, bool):
        put(b"?", b"1" if value else b"0")
    elif isinstance(value, int):
        put(b"i", str(value).encode())
    elif isinstance(value, float):
        put(b"f", value.hex().encode())
    elif isinstance(value, complex):
        put(b"c", f"{value.real.hex()},{value.imag.hex()}".encode())
    elif isinstance(value, str):
        put(b"s", value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        put(b"b", bytes(value))
    elif isinstance(value, Mapping):
        put(b"{", str(len(value)).encode())
        for key, item in value.items():
            _encode(key, digest)
            _encode(item, digest)
    elif isinstance(value, (tuple, list)):
        put(b"(" if isinstance(value, tuple) else b"[", str(len(value)).encode())
        for item in value:
            _encode(item, digest)
    else:
        array = np.asarray(value)
        if not array.dtype.hasobject:
            put(b"a", f"{array.dtype.str}{array.shape}".encode())
            put(b"d", np.ascontiguousarray(array).tobytes())
        elif array.ndim or array.item() is not value:  # an array of objects: its elements by value
            put(b"O", str(array.shape).encode())
            for element in array.flat:
                _encode(element, digest)
        else:  # an object NumPy holds as one opaque element: its type and attributes (no address)
            put(b"o", f"{type(value).__module__}.{type(value).__qualname__}".encode())
            _encode(_attributes(value), digest)


def _attributes(value: Any) -> Any:
    """An opaque object's state for :func:`_encode`: its ``__dict__``, else its ``__slots__``' values
    (a slotted object's default ``repr`` holds its address), else its ``repr``."""
    if hasattr(value, "__dict__"):
        return vars(value)
    slots: list[str] = []
    for cls in type(value).__mro__:
        declared = getattr(cls, "__slots__", ())
        slots += [declared] if isinstance(declared, str) else list(declared)
    return {name: getattr(value, name, None) for name in slots} if slots else repr(value)


def fingerprint(items: list[Any]) -> str:
    """A content hash of ``items`` in order, by value (:func:`_encode`; every rank must have read
    the same stream, and equal elements, ``None`` fields or strings included, hash equally in every
    process: before, an object's address was hashed)."""
    digest = hashlib.sha256()
    for item in items:
        _encode(item, digest)
    return digest.hexdigest()
