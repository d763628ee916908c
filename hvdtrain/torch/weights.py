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
        raise CheckpointError(f"{path} holds pickled objects besides tensors ({refusal(exc)}); refused, nothing in "
                              f"it ran") from None


def refusal(exc: BaseException) -> str:
    """What ``torch.load(weights_only=True)`` refused, from its many-line message: the line naming
    the global or opcode (``Trying to load unsupported GLOBAL posix.system ...``, ``Unsupported
    operand 149``), else its first line."""
    found = re.search(r"(?:unsupported GLOBAL|Unsupported global|Unsupported operand)[^\n]*", str(exc))
    return (found.group(0) if found else (str(exc).strip().splitlines() or [type(exc).__name__])[0])[:160]
