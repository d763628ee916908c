"""The fast lane: the Trainer's rules in-process, on :mod:`numpy_adapter` (no Horovod, no framework).

Every test here is marked ``fast`` (``pytest -m fast``) and runs through the public path only:
``Trainer(config, adapter=NumpyAdapter()).fit()``, its :class:`RunResult` or exception, and the
files of the output directory (``metrics.jsonl``, ``config.yaml``, ``checkpoints/``). The helpers
are in ``numpy_adapter.py`` (the adapter, recipe ``toy``) and ``toyrun.py`` (run it, read its files);
this folder is put on ``sys.path`` so the tests import them by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parents[1]):  # the helpers; the repository root (hvdtrain, recipes)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from numpy_adapter import RECIPE, register_toy_recipe, unregister_toy_recipe  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def toy_recipe():
    """Recipe ``toy`` registered for the test (tests re-register it with options), and removed after."""
    register_toy_recipe()
    yield RECIPE
    unregister_toy_recipe()
