"""The error a bad config key or value raises, and how a value is shown in its one line."""

from __future__ import annotations

import reprlib
from typing import Any


class ConfigError(ValueError):
    """A configuration key or value is not allowed; the message names it and what is allowed."""


ConfigError.__module__ = "hvdtrain.core.config"  # its public home: tracebacks and pickles name it there

_REPR = reprlib.Repr()  # Python 3.11's Repr takes no keyword arguments
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxlong, _REPR.maxother = 3, 8, 8, 80, 40, 80


def short(value: Any) -> str:
    """``repr(value)`` shortened (a long string, a huge list or an aliased YAML tree is shown in a
    few dozen characters, in bounded time): an error stays one readable line."""
    return _REPR.repr(value)


def key_text(key: str) -> str:
    """A key as typed when it is plain printable text, else quoted (a newline in a key stays on
    the error's one line)."""
    return key if key.isprintable() and len(key) <= 80 else short(key)


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of white space folded into single spaces."""
    return " ".join(text.split())
