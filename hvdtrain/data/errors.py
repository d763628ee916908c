"""The data pipeline's error for bad input (a module of its own so every data module can raise it)."""

from __future__ import annotations


class DataError(ValueError):
    """The data directory is missing, empty, or inconsistent, or an image cannot be decoded; the
    message names the file or folder."""
