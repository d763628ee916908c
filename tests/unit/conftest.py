"""Shared helpers for the unit tests.

The repository root is put on ``sys.path`` so that ``hvdtrain`` and ``recipes`` import whether
pytest is started as ``python -m pytest`` from the root or as the ``pytest`` script, and
whether or not the package is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (holds ``hvdtrain/`` and ``hvdtrain_recipes/``)."""
    return REPO_ROOT


@pytest.fixture
def private_index_cache(tmp_path, monkeypatch):
    """The image index cache (``HVDTRAIN_DATA_CACHE``) in the test's own folder: every test builds
    its index afresh and leaves the user's cache alone."""
    monkeypatch.setenv("HVDTRAIN_DATA_CACHE", str(tmp_path / "cache"))
