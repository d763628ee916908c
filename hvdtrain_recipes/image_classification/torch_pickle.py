"""Read a torch state dict file (``torch.save``'s zip format, torch >= 1.6) into NumPy arrays
without torch, for the TensorFlow side of ``model.pretrained``.

The file's ``data.pkl`` is unpickled with an allow-list, as ``torch.load(weights_only=True)`` does:
only ordered dicts, tensors (``torch._utils._rebuild_tensor_v2``, ``_rebuild_parameter``) and
storage types can be named; anything else (a function, a class with code) stops the read before it
is called. Each tensor's storage is the raw little-endian file ``data/<key>`` in the archive.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

STORAGES = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
            "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32,
            "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_}


class NotWeightsError(ValueError):
    """The file is not a torch zip of tensors, or names something besides tensors."""


class _StorageType:
    def __init__(self, name: str):
        self.name = name


def _whole_numbers(value: Any, what: str) -> tuple[int, ...]:
    """``value`` as a tuple of plain non-negative ints, else NotWeightsError naming ``what``."""
    if not isinstance(value, (tuple, list)) or len(value) > 64 or not all(
            type(v) is int and 0 <= v < 2**62 for v in value):
        raise NotWeightsError(f"a tensor's {what} {value!r:.80} is not a list of non-negative integers")
    return tuple(value)


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_: Any) -> np.ndarray:
    """The tensor ``storage[offset]`` viewed with ``size`` and ``stride`` (in elements), copied.

    The file's geometry is checked against the storage before anything is viewed: every element
    the view can reach (offset + sum((size - 1) * stride)) lies inside the storage, and the tensor
    holds no more elements than its storage (a weights file's tensors never overlap themselves).
    A file that claims more (before: a crash, or process memory read into the weights) is
    refused."""
    if not isinstance(storage, np.ndarray) or storage.ndim != 1:
        raise NotWeightsError("a tensor without its storage")
    (offset,) = _whole_numbers((offset,), "storage offset")
    size, stride = _whole_numbers(size, "size"), _whole_numbers(stride, "stride")
    if len(size) != len(stride):
        raise NotWeightsError(f"a tensor of size {size} has the strides {stride}")
    count = int(np.prod(size, dtype=object))
    if count:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= len(storage) or count > len(storage):
            raise NotWeightsError(f"a tensor of size {size}, strides {stride} and offset {offset} reaches past its "
                                  f"storage of {len(storage)} elements")
    elif offset > len(storage):
        raise NotWeightsError(f"a tensor's storage offset {offset} lies past its storage of {len(storage)} elements")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=[s * storage.itemsize for s in stride])
    return np.array(view)  # a copy: the storage may be shared by several tensors


def _rebuild_parameter(data: np.ndarray, *_: Any) -> np.ndarray:
    return data


class _Unpickler(pickle.Unpickler):
    ALLOWED = {("collections", "OrderedDict"): collections.OrderedDict,
               ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
               ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix = archive, prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return self.ALLOWED[(module, name)]
        if module == "torch" and name in STORAGES:
            return _StorageType(name)
        raise NotWeightsError(f"it names {module}.{name}, which a weights file has no reason to")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise NotWeightsError(f"unexpected persistent id {pid!r:.80}")
        name = f"{self.prefix}data/{pid[2]}"
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            raise NotWeightsError(f"it has no storage {name!r:.80}") from None
        if info.file_size > 100 * info.compress_size + (1 << 20):  # a zip bomb (torch stores, never compresses)
            raise NotWeightsError(f"its storage {name!r:.80} unpacks to {info.file_size:,} bytes from "
                                  f"{info.compress_size:,}")
        raw = self.archive.read(info)
        dtype = STORAGES[pid[1].name]
        if dtype == "bfloat16":  # no NumPy bfloat16: the upper half of a float32
            return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))


def load(path: str | Path) -> Any:
    """The object in ``path`` with tensors as NumPy arrays (bfloat16 as float32); raises
    :class:`NotWeightsError` for anything but torch's zip of tensors and plain containers."""
    if not zipfile.is_zipfile(path):
        raise NotWeightsError("not a torch zip file (a legacy pre-1.6 torch file or another pickle needs torch "
                              "to read)")
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise NotWeightsError("not a torch zip file (no data.pkl)")
        prefix = pickles[0][: -len("data.pkl")]
        if prefix + "byteorder" in archive.namelist() and archive.read(prefix + "byteorder").strip() != b"little":
            raise NotWeightsError("a big-endian torch file")
        try:
            return _Unpickler(archive.read(pickles[0]), archive, prefix).load()
        except NotWeightsError:
            raise
        except Exception as exc:  # a damaged pickle: say what the reader said
            raise NotWeightsError(f"its data.pkl does not unpickle ({type(exc).__name__}: {exc})") from None
