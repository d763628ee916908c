"""Reading a checkpoint's torch files: tensors and plain containers only, one line naming a file
that holds anything else.

``torch.load(weights_only=True)`` refuses a pickled object other than tensors (``os.system``, a
class with code) before anything in it runs, but says so in a 20-line message naming no file: the
``--resume`` of a checkpoint whose ``model.pt`` was replaced by such a pickle ended in a 75-line
traceback. :func:`load_weights_only` names the file and the object it refused in one line.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from hvdtrain.core.checkpoint import CheckpointError


def load_weights_only(path: str | Path, **kwargs: Any) -> Any:
    """``torch.load(path, weights_only=True, **kwargs)``; a file holding anything but tensors and
    plain containers is a :class:`CheckpointError` naming it (nothing in it ran)."""
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        found = re.search(r"(?:Unsupported global|Unsupported operand)[^\n]*", str(exc))
        detail = found.group(0)[:160] if found else (str(exc).strip().splitlines() or ["not tensors"])[0][:160]
        raise CheckpointError(f"{path} holds pickled objects besides tensors ({detail}); refused, nothing in it "
                              f"ran") from None
