"""The error a run stops with when it cannot start or continue (a leaf: every part of the loop raises it)."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """Training cannot start or continue; the message says why and what to do."""
