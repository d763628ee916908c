"""Issue 63, items 5 and 6: a stream read into memory is fingerprinted by value and bounded by what
it really holds.

Item 5, before: ``fingerprint`` hashed ``np.asarray(leaf).tobytes()``, for ``None`` or an object
array the objects' addresses, so identical streams with a ``None`` field were refused as "the
ranks see different training data". Item 6, before: the bound counted NumPy bytes only, so an endless
stream of zero-byte elements was never refused (1.15 GiB after 30 s and growing) and ``(int, int)``
items held 6.5x what was counted ("4 GiB" admitted about 26 GiB). The streams here are plain
Python iterables named ``IterableDataset`` (what ``as_source`` recognises a torch one by), so no
framework is imported.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
from numpy_adapter import RECIPE, register_toy_recipe
from toyrun import fit

from hvdtrain.core import streams
from hvdtrain.core.registry import get_builder, register_recipe
from hvdtrain.core.sources import SourceError, as_source


class IterableDataset:
    """A stream: whatever ``make()`` yields (an endless one too)."""

    def __init__(self, make):
        self.make = make

    def __iter__(self):
        return iter(self.make())


ROWS = """
import numpy as np
def rows(n, tag):
    for i in range(n):
        yield {"x": np.full(3, i, np.float32), "note": None, "name": "".join(["row", str(i)]),
               "tags": np.array([None, f"{tag}{i}"], dtype=object), "pair": (i, float(i))}
"""


def test_equal_streams_with_none_and_object_fields_fingerprint_equally_in_two_processes():
    script = ROWS + ("import sys; sys.path.insert(0, sys.argv[1])\nfrom hvdtrain.core import streams\n"
                     "print(streams.fingerprint(list(rows(20, 't'))))")
    root = str(streams.__file__).rsplit("/hvdtrain/", 1)[0]
    prints = {subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True, check=True,
                             timeout=120).stdout.strip() for _ in range(2)}
    namespace: dict = {}
    exec(ROWS, namespace)
    here = streams.fingerprint(list(namespace["rows"](20, "t")))
    assert prints == {here}, (prints, here)  # the same in every process, and in this one


def test_different_values_fingerprint_differently():
    namespace: dict = {}
    exec(ROWS, namespace)
    rows = namespace["rows"]
    base = list(rows(20, "t"))
    changed = [dict(r) for r in base]
    changed[7]["note"] = "late"
    other_tag = list(rows(20, "u"))  # only inside the object arrays
    swapped = base[:3] + [base[4], base[3]] + base[5:]
    prints = [streams.fingerprint(items) for items in (base, changed, other_tag, swapped, base[:-1])]
    assert len(set(prints)) == len(prints)
    assert streams.fingerprint([{"a": None}]) != streams.fingerprint([{"b": None}])  # keys count
    assert streams.fingerprint([(1, 2)]) != streams.fingerprint([[1, 2]]) != streams.fingerprint([np.array([1, 2])])


class Slotted:
    """An element type with ``__slots__`` (no ``__dict__``; its default repr holds its address)."""

    __slots__ = ("label", "weight")

    def __init__(self, label, weight):
        self.label, self.weight = label, weight


def test_equal_slotted_objects_fingerprint_equally_and_their_values_count():
    first = [(np.zeros(2), Slotted(i, 0.5)) for i in range(4)]
    again = [(np.zeros(2), Slotted(i, 0.5)) for i in range(4)]  # other objects, other addresses, same values
    assert streams.fingerprint(first) == streams.fingerprint(again)
    assert streams.fingerprint(first) != streams.fingerprint([(np.zeros(2), Slotted(i, 0.25)) for i in range(4)])


def endless_bytes():
    return itertools.repeat(b"")  # zero NumPy bytes an element, for ever


def test_an_endless_stream_of_zero_byte_elements_is_refused_by_its_element_count():
    with streams.limits(None, 100_000), pytest.raises(SourceError) as caught:
        as_source(IterableDataset(endless_bytes))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("TrainTask.train_data: ")
    assert "yields more than 100,000 elements (data.stream_max_elements=100000" in message, message


def test_zero_byte_elements_count_their_real_memory(monkeypatch):
    monkeypatch.setattr(streams, "LIMIT_BYTES", 8 * 2**20)  # 8 MiB: about 200,000 empty bytes objects
    with pytest.raises(SourceError) as caught:
        as_source(IterableDataset(lambda: itertools.islice(endless_bytes(), 2_000_000)))
    assert "holds more than 0.0078125 GiB after" in str(caught.value)
    assert "(data.stream_max_gib=0.0078125, counted with Python's object sizes" in str(caught.value)


def int_pairs():
    return ((i * 1000, i * 1000 + 1) for i in range(100_000))  # not the small ints Python shares


def test_int_pairs_are_counted_within_twice_their_real_memory(monkeypatch):
    tracemalloc.start()
    try:
        held = list(int_pairs())
        real = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del held
    monkeypatch.setattr(streams, "LIMIT_BYTES", real // 2)  # counted 16 bytes a pair before: accepted
    with pytest.raises(SourceError, match="holds more than"):
        as_source(IterableDataset(int_pairs))
    monkeypatch.setattr(streams, "LIMIT_BYTES", real * 2)
    assert len(as_source(IterableDataset(int_pairs))) == 100_000


def test_the_run_config_sets_the_bounds(tmp_path):
    register_toy_recipe()
    toy = get_builder(RECIPE, "torch")

    @register_recipe(RECIPE, framework="torch", replace=True)
    def build(config, ctx):
        return replace(toy(config, ctx), train_data=IterableDataset(endless_bytes))

    with pytest.raises(SourceError, match=r"yields more than 5,000 elements \(data\.stream_max_elements=5000;"):
        fit(tmp_path / "run", "data.stream_max_elements=5000")
    register_toy_recipe()
