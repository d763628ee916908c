"""The rank-0 gate: printing and file writes happen on rank 0 only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hvdtrain.core.redact import redact_text


class RankZeroGate:
    """Side effects for rank 0; other ranks' calls do nothing."""

    def __init__(self, rank: int):
        self.rank = rank

    @property
    def active(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0, flushed; secrets in URIs redacted."""
        if self.active:
            print(*(redact_text(a) if isinstance(a, str) else a for a in args), **kwargs, flush=True)

    def warn(self, message: str) -> None:
        """A warning on rank 0's stderr."""
        if self.active:
            print(f"hvdtrain: warning: {redact_text(message)}", file=sys.stderr, flush=True)

    def append_jsonl(self, path: Path, record: dict[str, Any]) -> None:
        """Append one JSON line to ``path`` on rank 0."""
        if self.active:
            with open(path, "a") as f:
                f.write(json.dumps(record, sort_keys=False) + "\n")
                f.flush()
