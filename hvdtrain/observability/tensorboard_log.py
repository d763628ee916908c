"""TensorBoard event files written by rank 0, next to ``metrics.jsonl`` (``log.trackers`` naming
``tensorboard``, the default; ``train.tensorboard=false``, the older switch, turns it off too).

Written with the ``tensorboard`` package's own record writer and protobufs, so neither torch nor
TensorFlow is imported. Tags (open with ``tensorboard --logdir runs``):

* per step (x: micro-batch number since the start of training): ``step/loss`` (rank 0's batch
  loss), ``step/lr``, ``step/samples_per_sec`` (all ranks);
* per epoch (x: epoch): ``epoch/<key>`` for every number in the ``metrics.jsonl`` line:
  ``train_loss``, ``val_loss``, ``val_accuracy``, ``lr``, ``samples_per_sec``, ``epoch_time_sec``.

:func:`read_scalars` reads them back (the ``hvdtrain report`` command uses it).
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

from hvdtrain.core.callbacks import Callback
from hvdtrain.core.rank0 import RankZeroGate

EVENT_FILE_MARKER = "tfevents"
EPOCH_SKIP_KEYS = ("epoch", "world_size", "step")
FLUSH_EVERY_SEC = 5.0


class EventFileWriter:
    """Appends scalar summaries to one TensorBoard event file (TFRecord of ``Event`` protos)."""

    def __init__(self, directory: Path):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        # TensorBoard reads a folder's files in name order: seconds first, then a unique tail
        self.path = directory / (f"events.out.{EVENT_FILE_MARKER}.{int(now):010d}.{socket.gethostname()}."
                                 f"{os.getpid()}.{time.time_ns() % 10**9:09d}.hvdtrain")
        self._records = RecordWriter(open(self.path, "xb"))
        self._write(event_pb2.Event(wall_time=now, step=0, file_version="brain.Event:2"))
        self.flush()

    def _write(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        """One event holding ``values`` (tag -> number) at ``step`` (and ``wall_time``, default now)."""
        summary = self._summary_pb2.Summary(value=[
            self._summary_pb2.Summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()])
        self._write(self._event_pb2.Event(wall_time=time.time() if wall_time is None else wall_time,
                                          step=int(step), summary=summary))

    def flush(self) -> None:
        """Make what was written visible to a running TensorBoard."""
        self._records.flush()

    def close(self) -> None:
        """Flush and close the file."""
        if not self._records.closed:
            self._records.flush()
            self._records.close()


class TensorBoardCallback(Callback):
    """Rank 0 logs step and epoch scalars to ``<output>/events.out.tfevents.*``."""

    def __init__(self) -> None:
        self.writer: EventFileWriter | None = None
        self._last_flush = 0.0
        self._pending: list[tuple[int, float, dict[str, Any]]] = []

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        self.steps_per_epoch = int(info["steps_per_epoch"])
        self.batch_size = info["config"].train.batch_size
        if not ctx.is_main:
            return
        try:
            self.writer = EventFileWriter(Path(info["output"]))
        except ImportError as exc:
            RankZeroGate(ctx.rank).warn(f"log.trackers=tensorboard: the tensorboard package is not installed ({exc}); "
                                        f"no event files are written (pip install tensorboard==2.21.0, or leave "
                                        f"tensorboard out of log.trackers)")
        self._last_flush, self._pending = time.monotonic(), []

    def on_step_end(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        if self.writer is None:
            return
        batch = math.ceil(logs["samples"] / self.batch_size)  # counts batches before a mid-epoch resume too
        # The loss may still be a device scalar: it is read (a host sync) only when events are written.
        self._pending.append((epoch * self.steps_per_epoch + batch, time.time(), {
            "step/loss": logs["loss"], "step/lr": logs["lr"], "step/samples_per_sec": logs["samples_per_sec"]}))
        if time.monotonic() - self._last_flush > FLUSH_EVERY_SEC:
            self._write_pending()
            self.writer.flush()
            self._last_flush = time.monotonic()

    def _write_pending(self) -> None:
        for step, wall_time, values in self._pending:
            self.writer.scalars(step, values, wall_time)
        self._pending = []

    def on_epoch_end(self, epoch: int, record: dict[str, Any]) -> None:
        if self.writer is None:
            return
        self._write_pending()
        self.writer.scalars(record.get("epoch", epoch + 1), {
            f"epoch/{key}": value for key, value in record.items()
            if key not in EPOCH_SKIP_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool)})
        self.writer.flush()
        self._last_flush = time.monotonic()

    def on_train_end(self, result: Any) -> None:
        if self.writer is not None:
            self._write_pending()
            self.writer.close()
            self.writer = None


def event_files(run_dir: str | Path) -> list[Path]:
    """The TensorBoard event files directly in ``run_dir``, in the order TensorBoard reads them (by name)."""
    return sorted(p for p in Path(run_dir).iterdir() if EVENT_FILE_MARKER in p.name and p.is_file())


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``run_dir``'s event files: tag -> ``[(step, value), ...]`` in file order.

    A resumed run appends a new file; points of a later file replace earlier ones at the same or a
    higher step of the same tag (what TensorBoard shows too). A half-written last record is ignored.
    """
    from tensorboard.compat.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in event_files(run_dir):
        data = path.read_bytes()
        pos, first_in_file = 0, set()
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            end = pos + 12 + length + 4
            if end > len(data):
                break
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos = end
            for value in event.summary.value:
                if not value.HasField("simple_value"):
                    continue
                points = scalars.setdefault(value.tag, [])
                if value.tag not in first_in_file:  # a resumed run rewinds: drop the superseded tail
                    first_in_file.add(value.tag)
                    points[:] = [p for p in points if p[0] < event.step]
                points.append((int(event.step), float(value.simple_value)))
    return scalars
