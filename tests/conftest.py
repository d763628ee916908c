"""Suite-wide rules for every test under ``tests/``.

A test leaves the process environment as it found it. Whatever a test (or the library code it
calls) writes to ``os.environ`` stays there for every later test in the session and, through
:func:`jobs.job_env`, reaches the jobs they launch: a unit test that left ``HOROVOD_AUTOTUNE`` set
once made a later elastic job segfault inside Horovod's autotuner. The autouse fixture below
snapshots ``os.environ`` before each test, and after it (its fixtures' teardown, ``monkeypatch``'s
undo included) puts the snapshot back and fails the test naming every variable it added, changed
or removed. Tests that need a variable set it with ``monkeypatch.setenv``/``delenv``; code under
test that writes ``os.environ`` itself is isolated with :func:`envguard.isolate_environ`.
"""

from __future__ import annotations

import os

import pytest

from envguard import environ_changes, restore_environ


@pytest.fixture(autouse=True)
def environment_unchanged(request: pytest.FixtureRequest):
    """Fail any test that leaves ``os.environ`` changed (after putting it back)."""
    before = dict(os.environ)
    yield
    changes = environ_changes(before, dict(os.environ))
    if not changes:
        return
    restore_environ(before)
    pytest.fail(f"{request.node.nodeid} left os.environ changed: " + "; ".join(changes)
                + " (use monkeypatch.setenv/delenv, or envguard.isolate_environ for code that sets variables "
                  "itself); the environment was restored", pytrace=False)
