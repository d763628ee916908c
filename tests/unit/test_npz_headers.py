"""Issue 63, item 2: a checkpoint ``.npz`` is checked member by member before any array is read.

Before: ``numpy.load`` learned an array's shape by reading it, so a 2 MB file declaring a 2 GiB
array (a deflated run of zeros) took 2 GiB of memory and 18-40 s before ``load_variables``' shape
check refused it, and ``comm_state.npz`` was read whole with no check at all. Here the crafted
files are scaled down (64 MiB of zeros deflated into 0.3 MB; a header declaring 2 GiB over 64 bytes;
an object array) and every reader of a checkpoint's ``.npz`` must refuse them with one
CheckpointError line naming the file and the member while tracemalloc (which counts NumPy's array
memory) sees less than a tenth of the declared array allocated.
"""

from __future__ import annotations

import pickle
import tracemalloc
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hvdtrain.core import compression_state
from hvdtrain.core.checkpoint import CheckpointError
from hvdtrain.core.npz import open_npz

SMALL_PEAK = 6 * 2**20  # bytes: the 64 MiB member may not be read (nor a 2 GiB one allocated)


def _header(dtype: str, shape: tuple[int, ...]) -> bytes:
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def crafted(path: Path, how: str, member: str, good: str = "0/steps") -> Path:
    """An .npz whose ``member`` is hostile (``how``), after a good member ``good`` (two int64)."""
    deflated = {"compression": zipfile.ZIP_DEFLATED, "compresslevel": 1} if how == "deflated" else {}
    with zipfile.ZipFile(path, "w", allowZip64=True, **deflated) as archive:
        archive.writestr(f"{good}.npy", _header("<i8", (2,)) + bytes(16), zipfile.ZIP_STORED)
        entry = f"{member}.npy"
        if how == "deflated":  # a well-formed 64 MiB array of zeros, deflated into about 0.3 MB
            with archive.open(entry, "w", force_zip64=True) as f:
                f.write(_header("<f8", (2**23,)))
                zeros = bytes(2**20)
                for _ in range(64):
                    f.write(zeros)
        elif how == "short":  # stored; the header declares 2 GiB, the member holds 64 bytes
            archive.writestr(entry, _header("<f8", (2**28,)) + bytes(64))
        elif how == "object":  # a pickle behind an object dtype
            archive.writestr(entry, _header("|O", (1,)) + pickle.dumps(np.array([print], dtype=object)))
        else:
            raise AssertionError(how)
    return path


HOW = ["deflated", "short", "object"]


def refused(read, file: Path, member: str) -> str:
    """``read()``'s CheckpointError line, checked to name the file and member, with a small peak."""
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as caught:
            read()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message and str(file) in message and f"'{member}.npy'" in message, message
    assert peak < SMALL_PEAK, f"{peak:,} bytes allocated before the refusal"
    return message


@pytest.mark.parametrize("how", HOW)
def test_comm_state_with_a_hostile_member_is_refused_before_it_is_read(tmp_path, how):
    file = crafted(tmp_path / compression_state.STATE_FILE, how, "1/model_buffer/00000")
    message = refused(lambda: compression_state.read(tmp_path, 2), file, "1/model_buffer/00000")
    assert {"deflated": "is compressed", "short": "declares a (268435456,) float64 array (2,147,483,648 bytes), "
            "the member holds 64", "object": "holds Python objects"}[how] in message, message


@pytest.mark.parametrize("how", HOW)
def test_tensorflow_variables_with_a_hostile_member_are_refused_before_they_are_read(tmp_path, how):
    from hvdtrain.tensorflow.checkpoint import load_variables

    file = crafted(tmp_path / "model_variables.npz", how, "v00000", good="v00001")
    assigned = []
    variables = [SimpleNamespace(shape=(2,), path=f"dense/v{i}", assign=assigned.append) for i in range(2)]
    refused(lambda: load_variables(file, variables), file, "v00000")
    assert assigned == []  # nothing loaded


def test_a_member_claiming_more_bytes_than_the_file_holds_is_refused(tmp_path):
    file = tmp_path / "big.npz"
    with zipfile.ZipFile(file, "w") as archive:
        archive.writestr("a.npy", _header("<f4", (4,)) + np.zeros(4, np.float32).tobytes())
    data = bytearray(file.read_bytes())
    central = data.rindex(b"PK\x01\x02")  # the central directory's entry: sizes at +20 (stored) and +24
    huge = (2**31).to_bytes(4, "little")
    data[central + 20:central + 28] = huge + huge
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"member 'a\.npy' declares 2,147,483,648 bytes that the file"):
        open_npz(file)


@pytest.mark.parametrize("content", [b"not a zip", b""])
def test_a_file_that_is_not_an_npz_is_one_line_naming_it(tmp_path, content):
    file = tmp_path / "comm_state.npz"
    file.write_bytes(content)
    with pytest.raises(CheckpointError, match=rf"^{file} is not a readable \.npz file \(BadZipFile"):
        compression_state.read(tmp_path, 1)


def test_good_files_read_back_exactly_and_a_caller_can_require_shape_and_dtype(tmp_path):
    arrays = {"0/error/00000": np.arange(6, dtype=np.float32).reshape(2, 3), "0/format": np.asarray(2),
              "1/error/00000": np.ones((2, 3), np.float32), "1/format": np.asarray(2)}
    with open(tmp_path / compression_state.STATE_FILE, "wb") as f:
        np.savez(f, **arrays)  # what compression_state.write does
    states = compression_state.read(tmp_path, 2)
    assert [sorted(s) for s in states] == [["error/00000", "format"]] * 2
    np.testing.assert_array_equal(states[0]["error/00000"], arrays["0/error/00000"])
    with open_npz(tmp_path / compression_state.STATE_FILE) as saved:
        assert saved.check("0/error/00000", (2, 3), np.float32).nbytes == 24
        with pytest.raises(CheckpointError, match=r"member '0/error/00000\.npy' holds shape \(2, 3\), the "
                                                  r"buffer has \(3, 2\)"):
            saved.check("0/error/00000", (3, 2), what="the buffer")
        with pytest.raises(CheckpointError, match=r"holds dtype int64, 0/format is float64"):
            saved.check("0/format", dtype=np.float64)


def test_tensorflow_save_variables_files_read_back(tmp_path):
    from hvdtrain.tensorflow.checkpoint import load_variables, save_variables

    values = [np.arange(4, dtype=np.float32), np.asarray(7, dtype=np.int64)]
    saved = [SimpleNamespace(shape=v.shape, path=f"dense/v{i}", name=f"v{i}", numpy=lambda v=v: v)
             for i, v in enumerate(values)]
    save_variables(tmp_path / "m.npz", saved)
    got = []
    load_variables(tmp_path / "m.npz", [SimpleNamespace(shape=v.shape, path=f"dense/v{i}", assign=got.append)
                                        for i, v in enumerate(values)])
    assert [a.tolist() for a in got] == [v.tolist() for v in values]
    with pytest.raises(ValueError, match=r"variable dense/v0 has shape \(5,\), the checkpoint has \(4,\)"):
        load_variables(tmp_path / "m.npz", [SimpleNamespace(shape=(5,), path="dense/v0", assign=got.append),
                                            SimpleNamespace(shape=(), path="dense/v1", assign=got.append)])
