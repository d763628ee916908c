"""Reading a checkpoint's ``.npz`` files with every member's header checked before any array is read.

``numpy.load`` learns an array's shape by reading the array: a 2 MB ``.npz`` whose member declares a
2 GiB array (a deflated run of zeros, or a zip entry claiming more bytes than the file holds) took
2 GiB of memory and tens of seconds before a caller could compare the shape with the model's.
:func:`open_npz` reads the zip's directory and each member's ``.npy`` header only
(``numpy.lib.format.read_magic`` and ``read_array_header_1_0``/``_2_0``: shape, dtype, order) and
refuses, with one :class:`~hvdtrain.core.checkpoint.CheckpointError` line naming the file and the
member, before any data is read:

* a file that is not a zip, a member that is not ``NAME.npy`` or is named twice;
* a compressed member (hvdtrain writes them stored, as ``numpy.savez`` does), a member whose
  declared size differs from its stored size, or that reaches past the end of the file, and
  members whose stored bytes add up to more than the file (overlapping entries): so every array
  read is backed by as many bytes of the file, and reading a file never takes more memory than
  its size on disk;
* a header numpy cannot parse (or of a format version other than 1.0 and 2.0), an ``object``
  dtype (a pickle: never read), and a header whose shape and dtype (their product in bytes) do not
  fill the member exactly;
* where the caller knows what a member must hold, another shape or dtype
  (:meth:`NpzReader.check`).

Only then are arrays read (:meth:`NpzReader.__getitem__`, ``allow_pickle=False``); a member whose
bytes fail the zip's CRC is a CheckpointError too. Used for every ``.npz`` of a checkpoint: the
TensorFlow model and optimizer variables (:mod:`hvdtrain.tensorflow.checkpoint`) and the per-rank
state ``comm_state.npz`` (:mod:`hvdtrain.core.compression_state`). NumPy only.
"""

from __future__ import annotations

import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdtrain.core.checkpoint import CheckpointError

SUFFIX = ".npy"
HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


@dataclass(frozen=True)
class Member:
    """One array of an ``.npz`` as its header declares it: ``name`` (without ``.npy``), ``shape``,
    ``dtype``, ``nbytes`` (shape times item size) and the zip entry it is stored in."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    info: zipfile.ZipInfo


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class NpzReader:
    """An open ``.npz`` whose members' headers were checked (see the module docstring); use as a
    context manager. ``files`` lists the members' names (without ``.npy``) in the file's order,
    as ``numpy.load``'s ``NpzFile`` does; ``members`` their headers."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot be read ({_first_line(exc)})") from None
        try:
            self._zip = zipfile.ZipFile(self._file)
            self.members = self._headers()
        except CheckpointError:
            self.close()
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
            self.close()
            raise CheckpointError(f"{self.path} is not a readable .npz file ({_first_line(exc)}); "
                                  f"nothing was loaded") from None
        self.files = list(self.members)

    def _refuse(self, member: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: member {member!r} {problem}; the file is damaged or not "
                               f"hvdtrain's: nothing was loaded")

    def _headers(self) -> dict[str, Member]:
        size = os.fstat(self._file.fileno()).st_size
        members: dict[str, Member] = {}
        stored = 0
        for info in self._zip.infolist():
            entry = info.filename
            if not entry.endswith(SUFFIX) or len(entry) == len(SUFFIX):
                raise self._refuse(entry[:120], "is not an array (NAME.npy)")
            name = entry[:-len(SUFFIX)]
            if name in members:
                raise self._refuse(entry[:120], "is in the file twice")
            if info.compress_type != zipfile.ZIP_STORED:
                raise self._refuse(entry, f"is compressed (zip method {info.compress_type}); hvdtrain "
                                          f"writes its arrays stored, as numpy.savez does")
            if info.compress_size != info.file_size:
                raise self._refuse(entry, f"declares {info.file_size:,} bytes but stores {info.compress_size:,}")
            stored += info.compress_size
            if info.header_offset + info.compress_size > size or stored > size:
                raise self._refuse(entry, f"declares {info.file_size:,} bytes that the file ({size:,} bytes) "
                                          f"does not hold")
            members[name] = self._header(name, info)
        return members

    def _header(self, name: str, info: zipfile.ZipInfo) -> Member:
        entry = info.filename
        with self._zip.open(info) as fp:
            try:
                version = np.lib.format.read_magic(fp)
                if version not in HEADER_READERS:
                    raise ValueError(f"format version {version[0]}.{version[1]} (1.0 or 2.0 are read)")
                shape, fortran_order, dtype = HEADER_READERS[version](fp)
            except (ValueError, EOFError, TypeError, SyntaxError) as exc:
                raise self._refuse(entry, f"has no readable array header ({_first_line(exc)})") from None
            header_bytes = fp.tell()
        if dtype.hasobject:
            raise self._refuse(entry, f"holds Python objects (dtype {dtype}), which are never read (no pickle)")
        nbytes = math.prod(int(n) for n in shape) * dtype.itemsize
        if header_bytes + nbytes != info.file_size:
            raise self._refuse(entry, f"declares a {tuple(shape)} {dtype} array ({nbytes:,} bytes), the member "
                                      f"holds {max(info.file_size - header_bytes, 0):,}")
        return Member(name, tuple(int(n) for n in shape), dtype, nbytes, info)

    def __contains__(self, name: object) -> bool:
        return name in self.members

    def check(self, name: str, shape: tuple[int, ...] | None = None, dtype: Any = None,
              what: str | None = None) -> Member:
        """The header of member ``name``, refused (CheckpointError naming file and member, and
        ``what`` it was to hold) if it is missing or its shape or dtype is not the given one."""
        label = what or name
        if name not in self.members:
            raise CheckpointError(f"{self.path} holds no {name!r} ({label}); nothing was loaded")
        member = self.members[name]
        if shape is not None and member.shape != tuple(int(n) for n in shape):
            raise self._refuse(f"{name}{SUFFIX}", f"holds shape {member.shape}, {label} has {tuple(shape)}")
        if dtype is not None and member.dtype != np.dtype(dtype):
            raise self._refuse(f"{name}{SUFFIX}", f"holds dtype {member.dtype}, {label} is {np.dtype(dtype)}")
        return member

    def __getitem__(self, name: str) -> np.ndarray:
        """The array of member ``name`` (its header already checked), read without pickles."""
        member = self.check(name)
        try:
            with self._zip.open(member.info) as fp:
                return np.lib.format.read_array(fp, allow_pickle=False)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise self._refuse(member.info.filename, f"cannot be read ({_first_line(exc)})") from None

    def close(self) -> None:
        """Close the file (idempotent)."""
        zip_file = getattr(self, "_zip", None)
        if zip_file is not None:
            zip_file.close()
        self._file.close()

    def __enter__(self) -> "NpzReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_npz(path: str | Path) -> NpzReader:
    """Open checkpoint file ``path`` with every member's header checked (:class:`NpzReader`)."""
    return NpzReader(path)
