"""What a W&B run's local transaction logs (``run-<id>.wandb``, online and offline alike) hold.

W&B writes every record of a run to that file (what ``wandb sync`` uploads); a process killed with
SIGKILL loses what its W&B service had not flushed yet. A resumed run reads the earlier pieces to
know which epochs W&B really has, and logs the missing ones again from ``metrics.jsonl``. The file
is a LevelDB-style log: a 7-byte ``:W&B`` header, then 32 KiB blocks of chunks (full, first, middle,
last), each whole record a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
HEADER = b":W&B"
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    """The ``Record`` protobufs of one ``.wandb`` file, in order (a torn tail is ignored)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != HEADER:
        return
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 or pos + 7 + length > len(data):
            if kind == 0 and length == 0:
                pos += left
                continue
            return
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == FIRST:
            pending = chunk
            continue
        if kind == MIDDLE:
            pending += chunk
            continue
        whole, pending = (chunk if kind == FULL else pending + chunk), b""
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(whole)
        except Exception:  # a damaged record: what follows cannot be trusted either
            return
        yield record


def logged(folder: Path, run_id: str) -> tuple[set[int], int]:
    """The epochs (``epoch`` of rows holding ``train_loss``) and the last ``global_step`` that the
    run ``run_id``'s files under ``folder`` hold."""
    epochs: set[int] = set()
    step = -1
    for path in Path(folder).glob(f"*-{run_id}/run-{run_id}.wandb"):
        for record in records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            row = {(item.key or "/".join(item.nested_key)): item.value_json for item in record.history.item}
            try:
                if "train_loss" in row and "epoch" in row:
                    epochs.add(int(json.loads(row["epoch"])))
                if "global_step" in row:
                    step = max(step, int(json.loads(row["global_step"])))
            except (TypeError, ValueError):
                continue
    return epochs, step
