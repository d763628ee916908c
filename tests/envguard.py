"""Keeping ``os.environ`` as a test found it: the helpers behind ``tests/conftest.py``'s autouse
fixture, and :func:`isolate_environ` for tests whose code under test sets variables itself."""

from __future__ import annotations

import os
from typing import Iterable

import pytest


# what library code sets in os.environ itself (setdefault), for isolate_environ
CLI_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "HVDTRAIN_TF_LOG_DEFAULT")  # import hvdtrain: TensorFlow's quiet start
TOKENIZER_VARIABLES = ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")  # hvdtrain_recipes.bert_finetune.tokenized

# pytest itself sets this one to the running test and phase; importing TensorFlow sets the others
# (once per process, whichever test imports it first)
IGNORED = frozenset({"PYTEST_CURRENT_TEST", "TF2_BEHAVIOR", "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION",
                     "ENABLE_RUNTIME_UPTIME_TELEMETRY", "HDF5_PLUGIN_PATH"})


def _describe(name: str, before: dict[str, str], after: dict[str, str]) -> str:
    if name not in before:
        return f"added {name}={after[name]!r}"
    if name not in after:
        return f"removed {name} (was {before[name]!r})"
    return f"changed {name} from {before[name]!r} to {after[name]!r}"


def environ_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per variable that differs between two snapshots of the environment, sorted by name."""
    names = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n) and n not in IGNORED)
    return [_describe(n, before, after) for n in names]


def restore_environ(snapshot: dict[str, str]) -> None:
    """Make ``os.environ`` equal to ``snapshot`` again (touching only the variables that differ)."""
    for name in [n for n in os.environ if n not in snapshot and n not in IGNORED]:
        del os.environ[name]
    for name, value in snapshot.items():
        if name not in IGNORED and os.environ.get(name) != value:
            os.environ[name] = value


def isolate_environ(monkeypatch: pytest.MonkeyPatch, names: Iterable[str]) -> None:
    """Let code under test set or clear ``names`` freely: each is unset now and put back as it was
    (set to its old value, or unset) when the test ends.

    ``monkeypatch.delenv(name, raising=False)`` alone does not do this for a variable that is not
    set: it records nothing, so a value the code sets later outlives the test.
    """
    for name in names:
        monkeypatch.setenv(name, "")  # records the current state (value or unset) for the undo
        monkeypatch.delenv(name)
