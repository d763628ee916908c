"""Read one sample's encoded image bytes from where the index says it is: the one read path of every format.

A sample's location (``where`` row of the index: shard, a, b) is one of three kinds:

* ``file``: the sample is a whole file (ImageFolder): ``root / key``;
* ``span``: bytes ``[a, a + b)`` of shard file ``shard`` (a WebDataset tar member, or a value of an
  Arrow IPC file's binary column: both are stored uncompressed, so one ``pread`` reads it);
* ``row``: row ``b`` of row group ``a`` of Parquet shard ``shard`` (``column``: the image
  column's bytes, e.g. ``image.bytes``); Parquet pages are compressed,
  so a random read decodes the whole row group's image column. The last :data:`ROW_GROUPS` row
  groups read are kept per process (a batch's samples are read in location order, so samples that
  share a row group cost one read).

Open shard files are kept in a bounded LRU of file descriptors (:data:`OPEN_FILES`). Nothing here
is shared between processes: each decoding worker builds its own reader.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

OPEN_FILES = 64
ROW_GROUPS = 2


class SampleReader:
    """Reads samples of one index entry: ``kind``, the shard paths, the image column (Parquet)."""

    def __init__(self, root: str, kind: str, shards: list[str], blob: np.ndarray, offsets: np.ndarray,
                 where: np.ndarray | None, column: str | None = None):
        self.root, self.kind, self.shards, self.column = Path(root), kind, shards, column
        self.blob, self.offsets, self.where = blob, offsets, where
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._groups: OrderedDict[tuple[int, int], object] = OrderedDict()

    def key(self, row: int) -> str:
        """Row ``row``'s key (relative path of a file, tar member key, Parquet/Arrow image path or row)."""
        return os.fsdecode(bytes(self.blob[self.offsets[row]:self.offsets[row + 1]]))

    def file(self, row: int) -> Path:
        """The file holding row ``row`` (the image file, or its shard)."""
        if self.where is None:
            return self.root / self.key(row)
        return self.root / self.shards[int(self.where[row, 0])]

    def name(self, row: int) -> str:
        """Row ``row`` as an error message names it: the file, or ``shard member KEY``."""
        if self.where is None:
            return str(self.file(row))
        return f"{self.file(row)} sample {self.key(row)!r}"

    def order(self, rows: np.ndarray) -> np.ndarray:
        """Positions of ``rows`` sorted by location (sequential reads; shared row groups read once)."""
        if self.where is None:
            return np.arange(len(rows))
        where = self.where[rows]
        return np.lexsort((where[:, 1], where[:, 0]))

    def read(self, row: int) -> bytes:
        """Row ``row``'s encoded image. Raises OSError/ValueError (with the reason) if unreadable."""
        if self.where is None:
            with open(self.file(row), "rb") as f:
                return f.read()
        shard, a, b = (int(v) for v in self.where[row])
        if self.kind == "span":
            if b < 0:
                raise ValueError("the sample holds no image bytes (a null value)")
            data = os.pread(self._fd(shard), b, a)
            if len(data) != b:
                raise OSError(f"the shard ends {b - len(data)} bytes before the end of the sample "
                              f"(truncated after the index was built?)")
            return data
        return self._row(shard, a, b)

    def _fd(self, shard: int) -> int:
        fd = self._fds.pop(shard, None)
        if fd is None:
            fd = os.open(self.root / self.shards[shard], os.O_RDONLY)
            while len(self._fds) >= OPEN_FILES:
                os.close(self._fds.popitem(last=False)[1])
        self._fds[shard] = fd
        return fd

    def _row(self, shard: int, group: int, row: int) -> bytes:
        column = self._groups.pop((shard, group), None)
        if column is None:
            import pyarrow.parquet as pq

            table = pq.ParquetFile(self.root / self.shards[shard]).read_row_group(group, columns=[self.column])
            column = table.column(0).combine_chunks()
            if self.column.endswith(".bytes") and column.type.num_fields:
                column = column.field("bytes")
            while len(self._groups) >= ROW_GROUPS:
                self._groups.popitem(last=False)
        self._groups[(shard, group)] = column
        value = column[row].as_py()
        if value is None:
            raise ValueError(f"column {self.column!r} holds no image bytes in this row")
        return value

    def close(self) -> None:
        """Close the open shard files and drop the cached row groups."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._groups.clear()
