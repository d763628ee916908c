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

The two Docker modules (tests/cluster, tests/slurm) use images built once for both
(tests/cluster/images.py). A run that includes them, with no ``-k``/``-m`` selection, starts that
build in the background as the session starts (log: /tmp/hvdtrain-docker-images/prebuild.log;
``HVDTRAIN_DOCKER_PREBUILD=0`` turns it off), and the two modules are handed out only after the
modules ahead of them add up to the build's expected seconds once per worker
(``_docker_images`` in tests/module_seconds.json): the workers run jobs while the images build,
instead of both waiting on the build at the start.

At the end of a run the terminal summary lists every module's seconds (its tests' set-up, call and
tear-down added up, in whichever worker ran it) beside the seconds it is expected to take, longest
first, and flags a module that took twice its expected time or more: a module that doubles is seen
in the next run's log. ``python tests/module_seconds.py LOG`` rewrites tests/module_seconds.json from
those lines.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from envguard import environ_changes, restore_environ

# ``import hvdtrain`` sets TensorFlow's quiet-start defaults in os.environ (hvdtrain/tools/tf_logging.py):
# done here, before any test's snapshot, so the test that happens to import it first is not blamed
import hvdtrain  # noqa: E402,F401
# ``import cv2`` (OpenCV, the image loader's resize) adds its lib64 folder to LD_LIBRARY_PATH: also done
# here, or the first test of a worker that imports it (a TensorBoard read, say) fails the environment check
import cv2  # noqa: E402,F401

TESTS = Path(__file__).resolve().parent
JOB_FOLDERS = ("distributed", "reliability", "cluster", "slurm")  # every test launches real horovodrun jobs
_TABLE = json.loads((TESTS / "module_seconds.json").read_text())
MODULE_SECONDS = {name: seconds for name, seconds in _TABLE.items() if not name.startswith("_")}
DOCKER_FOLDERS = ("cluster", "slurm")  # their modules wait on tests/cluster/images.py's build
DOCKER_IMAGES_SECONDS = float(_TABLE.get("_docker_images", 300))  # the images' build on a fresh machine
WORKERS_FOR_ORDER = 2  # make test's pytest workers: the head start is the build's seconds on each
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
    items[:] = docker_modules_later(items, seconds)


def docker_modules_later(items: list[pytest.Item], seconds: dict[int, float]) -> list[pytest.Item]:
    """``items`` (sorted longest module first) with the Docker modules' tests moved to where the
    modules before them add up to :data:`DOCKER_IMAGES_SECONDS` per worker: by then the images
    that the session's start began building are ready."""
    def folder(item: pytest.Item) -> str:
        try:
            return Path(str(item.path)).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            return ""

    docker = [item for item in items if folder(item) in DOCKER_FOLDERS]
    rest = [item for item in items if folder(item) not in DOCKER_FOLDERS]
    head, counted, at = WORKERS_FOR_ORDER * DOCKER_IMAGES_SECONDS, set(), len(rest)
    total = 0.0
    for index, item in enumerate(rest):
        if item.path not in counted:  # the first test of a module: the Docker modules may go before it
            if total >= head:
                at = index
                break
            counted.add(item.path)
            total += seconds[id(item)]
    return rest[:at] + docker + rest[at:]


def _docker_modules_run(config: pytest.Config) -> set[str]:
    """The Docker folders this session's arguments take in (none under a -k/-m selection)."""
    if config.getoption("keyword", "") or config.getoption("markexpr", "") or config.getoption("collectonly", False):
        return set()
    taken = set()
    for arg in config.args or [str(TESTS)]:
        path = Path(str(arg).split("::", 1)[0]).resolve()
        for name in DOCKER_FOLDERS:
            where = TESTS / name
            if where == path or path in where.parents or where in path.parents:
                taken.add(name)
    return taken


_PREBUILD: list[subprocess.Popen] = []


def pytest_configure(config: pytest.Config) -> None:
    """Start the Docker modules' images building in the background (see the module docstring)."""
    if hasattr(config, "workerinput") or os.environ.get("HVDTRAIN_DOCKER_PREBUILD", "1") == "0":
        return
    folders = _docker_modules_run(config)
    if not folders:
        return
    from cluster.dockerhosts import docker_capability
    from cluster.images import HOME

    if docker_capability() is not None:
        return  # the modules skip (or, under CI=true, fail) with the reason themselves
    HOME.mkdir(parents=True, exist_ok=True)
    with open(HOME / "prebuild.log", "w") as log:
        wanted = ["cpu", "slurm"] if "slurm" in folders else ["cpu"]
        _PREBUILD.append(subprocess.Popen([sys.executable, str(TESTS / "cluster" / "images.py"), *wanted], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=TESTS.parent,
                                          start_new_session=True))


def pytest_unconfigure(config: pytest.Config) -> None:
    """A background image build still running when the session ends (interrupted, or its Docker
    modules deselected) is stopped: nothing this session started outlives it."""
    for proc in _PREBUILD:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


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


_MODULE_SECONDS_RUN: dict[str, float] = collections.defaultdict(float)
DOUBLED = 2.0  # a module this many times its expected seconds (or more) is flagged


def module_of(nodeid: str) -> str:
    """The module of a test id, relative to tests/ (``tests/unit/test_x.py::test_y`` -> ``unit/test_x.py``)."""
    path = nodeid.split("::", 1)[0]
    return path[len("tests/"):] if path.startswith("tests/") else path


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # under xdist the controller receives every worker's reports: the sums cover the whole run
    _MODULE_SECONDS_RUN[module_of(report.nodeid)] += getattr(report, "duration", 0.0) or 0.0


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _MODULE_SECONDS_RUN:
        return
    write = terminalreporter.write_line
    terminalreporter.section("module seconds (set-up + call + tear-down; expected: tests/module_seconds.json)")
    flagged = []
    for name, seconds in sorted(_MODULE_SECONDS_RUN.items(), key=lambda kv: -kv[1]):
        expected = expected_seconds(Path(name)) if not name.startswith("/") else 0
        ratio = f"x{seconds / expected:.2f}" if expected else "new"
        mark = "  << DOUBLED" if expected >= 5 and seconds >= DOUBLED * expected else ""
        if mark:
            flagged.append(name)
        write(f"{seconds:8.1f}s module   tests/{name}  (expected {expected:.0f} s, {ratio}){mark}")
    total = sum(_MODULE_SECONDS_RUN.values())
    write(f"{total:8.1f}s in all ({len(_MODULE_SECONDS_RUN)} modules; {len(flagged)} took twice their expected "
          f"time or more{': ' + ', '.join(flagged) if flagged else ''})")
