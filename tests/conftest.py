"""Suite-wide rules for every test under ``tests/``.

A test leaves the process environment as it found it. Whatever a test (or the library code it
calls) writes to ``os.environ`` stays there for every later test in the session and, through
:func:`jobs.job_env`, reaches the jobs they launch: a unit test that left ``HOROVOD_AUTOTUNE`` set
once made a later elastic job segfault inside Horovod's autotuner. The autouse fixture below
snapshots ``os.environ`` before each test, and after it (its fixtures' teardown, ``monkeypatch``'s
undo included) puts the snapshot back and fails the test naming every variable it added, changed
or removed. Tests that need a variable set it with ``monkeypatch.setenv``/``delenv``; code under
test that writes ``os.environ`` itself is isolated with :func:`envguard.isolate_environ`.

Markers (registered in ``pyproject.toml``) are given here by place, so that one feature's tests,
unit, in-process and real-job alike, are selected together (``pytest -m resume``): every test in a
folder of real ``horovodrun`` jobs is ``distributed``; tests/fast is ``fast`` (its conftest); the
files below carry their feature's marker.

``make test`` runs the suite in two pytest-xdist workers (``-n 2 --dist loadfile``: a module runs
whole in one worker). The modules are handed out longest first, by the seconds each took in a run
in one process (``tests/module_seconds.json``), so the workers end together instead of one of them
finishing a long module alone at the end (``--no-loadscope-reorder`` keeps this order; xdist would
otherwise hand out the modules with the most tests first).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envguard import environ_changes, restore_environ

# ``import hvdtrain`` sets TensorFlow's quiet-start defaults in os.environ (hvdtrain/tools/tf_logging.py):
# done here, before any test's snapshot, so the test that happens to import it first is not blamed
import hvdtrain  # noqa: E402,F401

TESTS = Path(__file__).resolve().parent
JOB_FOLDERS = ("distributed", "reliability", "cluster", "slurm")  # every test launches real horovodrun jobs
MODULE_SECONDS = {name: seconds for name, seconds in json.loads((TESTS / "module_seconds.json").read_text()).items()
                  if not name.startswith("_")}
NEW_JOB_MODULE_SECONDS = 30  # a module not yet measured that launches jobs: ahead of the in-process ones
FEATURES = {  # test file (relative to tests/) -> its feature markers; tests/fast files mark themselves
    "unit/test_checkpoint.py": ("checkpoint",),
    "unit/test_schedule.py": ("lr_schedule",),
    "unit/test_faults_parse.py": ("faults",),
    "unit/test_compression_config.py": ("compression",),
    "unit/test_pipeline_blocks.py": ("pipeline",),
    "unit/test_pipeline_core.py": ("pipeline",),
    "unit/test_pipeline_gpipe.py": ("pipeline",),
    "reliability/test_exact_resume.py": ("resume",),
    "reliability/test_world_size_changes.py": ("resume",),
    "reliability/test_compression_resume.py": ("resume", "compression"),
    "reliability/test_elastic.py": ("elastic",),
    "reliability/test_faults.py": ("faults",),
    "distributed/test_compression.py": ("compression",),
    "distributed/test_pipeline.py": ("pipeline",),
    "distributed/test_pipeline_bert.py": ("pipeline",),
}


def expected_seconds(where: Path) -> float:
    """How long the module at ``where`` (relative to tests/) is expected to take."""
    if where.as_posix() in MODULE_SECONDS:
        return MODULE_SECONDS[where.as_posix()]
    return NEW_JOB_MODULE_SECONDS if where.parts[0] in JOB_FOLDERS + ("integration",) else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds: dict[int, float] = {}
    for item in items:
        try:
            where = Path(str(item.path)).resolve().relative_to(TESTS)
        except ValueError:
            seconds[id(item)] = 0
            continue
        seconds[id(item)] = expected_seconds(where)
        if where.parts[0] in JOB_FOLDERS and item.get_closest_marker("distributed") is None:
            item.add_marker(pytest.mark.distributed)
        for name in FEATURES.get(where.as_posix(), ()):
            item.add_marker(getattr(pytest.mark, name))
    items.sort(key=lambda item: -seconds[id(item)])  # stable: a module's tests keep their order


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
