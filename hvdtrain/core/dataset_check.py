"""Every rank trains the same data: the datasets' counts and fingerprints compared across ranks.

Hosts that see different trees (a stale NFS cache, a copy still in progress, an elastic joiner with
another version of the files) would otherwise get unequal step counts and hang at the epoch-end
collective, or the same count in another order or with other labels and train silently wrong.
Before the first step (and after every elastic re-form) each rank describes its training and
validation data (``len`` and, where the dataset has one, ``fingerprint()``: a content hash of what
it yields, label mapping included); one ``allgather_object`` brings every description to every
rank, so all of them reach the same verdict and stop together with one line naming the ranks and
hosts that differ. Framework-neutral: it uses the adapter's object collective only.
"""

from __future__ import annotations

import socket
from typing import Any

from hvdtrain.core.errors import TrainingError


def describe(data: Any) -> tuple[int, str | None]:
    """``(count, fingerprint)`` of a dataset (fingerprint None when it offers none)."""
    fingerprint = getattr(data, "fingerprint", None)
    return len(data), (str(fingerprint()) if callable(fingerprint) else None)


def _group(records: list[dict[str, Any]], split: str) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for rank, record in enumerate(records):
        groups.setdefault(tuple(record[split]), []).append(rank)
    return groups


def _ranks(ranks: list[int], records: list[dict[str, Any]]) -> str:
    hosts = sorted({records[r]["host"] for r in ranks})
    listed = ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed} on {', '.join(hosts[:8])}" + (" ..." if len(hosts) > 8 else "")


def compare(records: list[dict[str, Any]]) -> str | None:
    """The refusal (one line) when the ranks' descriptions differ, else None. ``records[rank]`` is
    ``{"host": name, "train": (count, fingerprint), "val": (count, fingerprint)}``."""
    for split, what in (("train", "training"), ("val", "validation")):
        groups = _group(records, split)
        if len(groups) < 2:
            continue
        parts = []
        for (count, fingerprint), ranks in sorted(groups.items(), key=lambda item: item[1][0]):
            parts.append(f"{_ranks(ranks, records)}: {count} samples"
                         + (f", fingerprint {fingerprint[:12]}" if fingerprint else ""))
        return (f"the ranks see different {what} data ({'; '.join(parts)}): every host must read the same "
                f"files (a copy or sync still running? a stale network file system cache?); nothing was trained")
    return None


def check_same_data(adapter: Any, task: Any) -> None:
    """Collective, on every rank: raise :class:`TrainingError` on all ranks alike if their training or
    validation data differ."""
    mine = {"host": socket.gethostname(), "train": describe(task.train_data),
            "val": describe(task.val_data) if task.val_data is not None else (0, None)}
    refusal = compare(adapter.allgather_object(mine))
    if refusal:
        raise TrainingError(refusal)
