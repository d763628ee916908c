"""Read a Horovod timeline (``comm.timeline`` / ``--timeline FILE``): what was reduced, how big, when.

Horovod writes a Chrome-trace JSON array on rank 0: one trace "process" per tensor, with nested
begin/end events per phase (``NEGOTIATE_ALLREDUCE``, then ``ALLREDUCE`` containing
``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE``/``MPI_ALLREDUCE``, ...). The event that closes a
collective carries the tensor's ``dtype`` and ``shape``, so the bytes each collective moved can be
read off the file. A timeline still being written lacks its closing bracket; :func:`load_events`
accepts that.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
               "int16": 2, "int32": 4, "int64": 8, "bool": 1}
COLLECTIVES = ("ALLREDUCE", "ADASUM", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")


@dataclass
class Activity:
    """One begin/end pair: ``tensor`` (the trace process name), phase ``name``, times in seconds,
    nesting ``depth`` (0: a whole collective or its negotiation) and the closing event's args."""

    tensor: str
    name: str
    start: float
    end: float
    depth: int
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        """End minus start, in seconds."""
        return self.end - self.start

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor this collective reduced (0 if the event has no dtype/shape)."""
        dtype, shape = self.args.get("dtype"), self.args.get("shape")
        if dtype is None or shape is None:
            return 0
        dims = [int(d) for d in str(shape).strip("[]").split(",") if d.strip()]
        return DTYPE_BYTES.get(str(dtype), 0) * math.prod(dims)


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The trace events of a timeline file, complete or still being written."""
    text = Path(path).read_text().strip()
    if not text:
        return []
    if not text.endswith("]"):
        text = text.rstrip().rstrip(",") + "]"
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a Horovod timeline (Chrome trace JSON): {exc}") from None


def activities(events: list[dict[str, Any]]) -> list[Activity]:
    """Every begin/end pair, matched per tensor, in order of their end."""
    names: dict[Any, str] = {}
    stacks: dict[Any, list[tuple[str, float]]] = {}
    out: list[Activity] = []
    for event in events:
        pid, phase = event.get("pid"), event.get("ph")
        if phase == "M" and event.get("name") == "process_name":
            names[pid] = event.get("args", {}).get("name", str(pid))
        elif phase == "B":
            stacks.setdefault(pid, []).append((event["name"], event["ts"] / 1e6))
        elif phase == "E" and stacks.get(pid):
            name, start = stacks[pid].pop()
            out.append(Activity(names.get(pid, str(pid)), name, start, event["ts"] / 1e6,
                                len(stacks[pid]), event.get("args", {})))
    return out


def collectives(acts: list[Activity], prefix: str = "") -> list[Activity]:
    """Top-level collective operations (negotiation left out), optionally only for tensors whose
    trace name starts with ``prefix`` (Horovod names them ``allreduce.<tensor name>``)."""
    return [a for a in acts if a.depth == 0 and a.name in COLLECTIVES and a.tensor.startswith(prefix)]


def cycle_marks(events: list[dict[str, Any]]) -> list[float]:
    """Times (seconds) of the background thread's cycle marks (``comm.timeline_mark_cycles``)."""
    return sorted(e["ts"] / 1e6 for e in events if e.get("name") == "CYCLE_START" and "ts" in e)


def covered_seconds(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals."""
    total, last_end = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= last_end:
            continue
        total += end - max(start, last_end)
        last_end = end
    return total
