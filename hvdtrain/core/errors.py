"""The error a run stops with when it cannot start or continue (a leaf: every part of the loop raises it)."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """Training cannot start or continue; the message says why and what to do."""


def type_name(obj: object) -> str:
    """The qualified name of ``obj``'s type, as an error line names something the user passed."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
