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

Shards may be remote (``root`` a URL, :mod:`hvdtrain.data.remote`): a span is then one range
request, a Parquet row group a few. In streaming mode (:mod:`hvdtrain.data.stream`) whole shards
are copied ahead of use into a local *spool* folder (named by :func:`spool_name`); a shard found
there is read locally, any other remotely, so what is read never depends on the spool's state.

Open shard files are kept in a bounded LRU of file descriptors (:data:`OPEN_FILES`; a spooled copy
deleted meanwhile is reopened or read remotely). Nothing here is shared between processes: each
decoding worker builds its own reader.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

OPEN_FILES = 64
ROW_GROUPS = 2


def spool_name(shard: int, relative: str) -> str:
    """The spooled copy's file name of shard number ``shard`` (relative path ``relative``)."""
    return f"{shard:06d}-{os.path.basename(relative)}"


class SampleReader:
    """Reads samples of one index entry: ``kind``, the shard paths, the image column (Parquet)."""

    def __init__(self, root: str, kind: str, shards: list[str], blob: np.ndarray, offsets: np.ndarray,
                 where: np.ndarray | None, column: str | None = None, spool: str | None = None):
        from hvdtrain.data import remote

        self.remote = remote.is_url(root)
        self.root = str(root) if self.remote else Path(root)
        self.kind, self.shards, self.column, self.spool = kind, shards, column, spool
        self.blob, self.offsets, self.where = blob, offsets, where
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._groups: OrderedDict[tuple[int, int], object] = OrderedDict()

    def key(self, row: int) -> str:
        """Row ``row``'s key (relative path of a file, tar member key, Parquet/Arrow image path or row)."""
        return os.fsdecode(bytes(self.blob[self.offsets[row]:self.offsets[row + 1]]))

    def file(self, row: int) -> Path | str:
        """The file holding row ``row`` (the image file, or its shard: a URL for remote shards)."""
        if self.where is None:
            return self.root / self.key(row)
        return self.location(int(self.where[row, 0]))

    def location(self, shard: int) -> Path | str:
        """Shard ``shard``'s path or URL."""
        if self.remote:
            return self.root.rstrip("/") + "/" + self.shards[shard]
        return self.root / self.shards[shard]

    def _local(self, shard: int) -> str | None:
        """A local file holding shard ``shard`` (its spooled copy, or the shard itself), or None."""
        if self.spool is not None:
            copy = os.path.join(self.spool, spool_name(shard, self.shards[shard]))
            if os.path.exists(copy):
                return copy
        return None if self.remote else str(self.location(shard))

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
            data = self._span(shard, a, b)
            if len(data) != b:
                raise OSError(f"the shard ends {b - len(data)} bytes before the end of the sample "
                              f"(truncated after the index was built?)")
            return data
        return self._row(shard, a, b)

    def _span(self, shard: int, a: int, b: int) -> bytes:
        path = self._local(shard)
        if path is not None:
            try:
                return os.pread(self._fd(shard, path), b, a)
            except FileNotFoundError:
                if not self.remote:
                    raise
        from hvdtrain.data import remote

        return remote.read_range(str(self.location(shard)), a, b)

    def _fd(self, shard: int, path: str) -> int:
        fd = self._fds.pop(shard, None)
        if fd is not None and self.spool is not None and os.fstat(fd).st_nlink == 0:
            os.close(fd)  # a spooled copy deleted since: reopen what is there now
            fd = None
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
            while len(self._fds) >= OPEN_FILES:
                os.close(self._fds.popitem(last=False)[1])
        self._fds[shard] = fd
        return fd

    def _row(self, shard: int, group: int, row: int) -> bytes:
        column = self._groups.pop((shard, group), None)
        if column is None:
            import pyarrow.parquet as pq

            path = self._local(shard)
            if path is None:
                from hvdtrain.data import remote

                with remote.open_file(str(self.location(shard)), reading=True) as source:
                    table = pq.ParquetFile(source).read_row_group(group, columns=[self.column])
            else:
                table = pq.ParquetFile(path).read_row_group(group, columns=[self.column])
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
