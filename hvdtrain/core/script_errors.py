"""hvdtrain's refusals in a user's own script, as one line per job (what ``hvdtrain``'s commands
print, :func:`hvdtrain.cli.common.fail`), for :func:`hvdtrain.keras.init` and any other entry point
of an own script (:func:`install`; ``hvdtrain.torch.prepare`` may share it).

A command turns a refusal into ``hvdtrain: error: MESSAGE`` and a non-zero exit; a user's script has
no such wrapper, so an uncaught refusal raised alike on every rank (hvdtrain raises its refusals
on every rank, after rank 0's verdict is broadcast) printed a traceback on every rank. :func:`install`
sets ``sys.excepthook``: an uncaught error of :data:`OWN_SCRIPT_ERRORS` prints that one line on rank 0
(secrets in URIs redacted; the other ranks print nothing) and the process exits 2 for a
:class:`~hvdtrain.core.config.ConfigError`, 1 for the others, as the commands do; ``HVDTRAIN_TRACEBACK=1``
prints the traceback first (every rank). Every other exception goes to the hook that was there
before, with its traceback: a user's own ``ValueError`` is not hvdtrain's to shorten.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from hvdtrain.core.checkpoint import CheckpointError
from hvdtrain.core.config_error import ConfigError
from hvdtrain.core.errors import TrainingError
from hvdtrain.core.redact import redact_text

# hvdtrain's own refusals: each message says what is wrong and what to do, and every rank raises it
OWN_SCRIPT_ERRORS: tuple[type[BaseException], ...] = (ConfigError, CheckpointError, TrainingError)

_installed: dict[str, Any] = {}  # the rank function, and the hook that was there before ours


def exit_code(exc: BaseException) -> int:
    """The exit status the commands give ``exc``: 2 for a bad config value or name, 1 otherwise."""
    return 2 if isinstance(exc, ConfigError) else 1


def error_line(exc: BaseException) -> str:
    """``hvdtrain: error: MESSAGE`` (the commands' line), secrets in URIs redacted, on one line."""
    return f"hvdtrain: error: {' '.join(redact_text(str(exc)).split())}"


def install(rank: Callable[[], int]) -> None:
    """Make an uncaught :data:`OWN_SCRIPT_ERRORS` error end this process with one line on rank 0
    (``rank()``: this process's rank, e.g. ``hvd.rank``; 0 if it cannot say) and the commands'
    exit status, no traceback. Calling it again only replaces ``rank``."""
    _installed["rank"] = rank
    if sys.excepthook is not _hook:
        _installed["previous"] = sys.excepthook
        sys.excepthook = _hook


def _rank() -> int:
    try:
        return int(_installed["rank"]())
    except Exception:  # Horovod not started (or shut down): speak as the only rank
        return 0


def _hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """``sys.excepthook``: hvdtrain's refusals as one line on rank 0 and an exit status; others as before."""
    if not isinstance(exc, OWN_SCRIPT_ERRORS):
        _installed.get("previous", sys.__excepthook__)(kind, exc, tb)
        return
    if os.environ.get("HVDTRAIN_TRACEBACK"):
        sys.__excepthook__(kind, exc, tb)
    if _rank() == 0:
        print(error_line(exc), file=sys.stderr, flush=True)
    sys.exit(exit_code(exc))
