"""The suite's environment rules: a test that leaves os.environ changed fails (and the environment is
put back for the next one), and launched jobs inherit no HOROVOD_* variable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from envguard import environ_changes, isolate_environ, restore_environ
from jobs import job_env, run

TESTS = Path(__file__).resolve().parents[1]

LEAKY = textwrap.dedent("""
    import os

    def test_leaks():
        os.environ["HVDTRAIN_LEAK_PROBE"] = "1"
        os.environ["HOME"] = "/elsewhere"

    def test_next_one_finds_it_put_back():
        assert "HVDTRAIN_LEAK_PROBE" not in os.environ and os.environ["HOME"] != "/elsewhere"

    def test_monkeypatch_is_fine(monkeypatch):
        monkeypatch.setenv("HVDTRAIN_LEAK_PROBE", "2")
""")


def test_a_leaking_test_fails_naming_the_variables_and_the_next_test_finds_them_restored(tmp_path):
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    # tests/conftest.py loaded as a plugin: its autouse fixture applies to the file outside tests/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                           "-o", "addopts=", str(tmp_path / "test_leaky.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "test_leaks left os.environ changed" in proc.stdout
    assert "added HVDTRAIN_LEAK_PROBE='1'" in proc.stdout and "changed HOME from" in proc.stdout
    assert "3 passed, 1 error" in proc.stdout  # the leak is an error at teardown; the others pass


def test_environ_changes_and_restore(monkeypatch):
    isolate_environ(monkeypatch, ("HVDTRAIN_PROBE_A", "HVDTRAIN_PROBE_B"))
    monkeypatch.setenv("HVDTRAIN_PROBE_A", "1")
    before = dict(os.environ)
    os.environ["HVDTRAIN_PROBE_A"] = "2"
    os.environ["HVDTRAIN_PROBE_B"] = "3"
    assert environ_changes(before, dict(os.environ)) == ["changed HVDTRAIN_PROBE_A from '1' to '2'",
                                                         "added HVDTRAIN_PROBE_B='3'"]
    restore_environ(before)
    assert dict(os.environ) == before


def test_isolate_environ_puts_back_an_unset_variable_the_code_sets(monkeypatch):
    with monkeypatch.context() as inner:
        isolate_environ(inner, ("HVDTRAIN_PROBE_C",))
        os.environ["HVDTRAIN_PROBE_C"] = "set by the code under test"
    assert "HVDTRAIN_PROBE_C" not in os.environ


def test_jobs_inherit_no_horovod_variable_unless_passed(monkeypatch):
    monkeypatch.setenv("HOROVOD_AUTOTUNE", "1")
    monkeypatch.setenv("HOROVOD_TIMELINE", "/tmp/t.json")
    assert not [name for name in job_env() if name.startswith("HOROVOD_")]
    proc = run([sys.executable, "-c", "import os; print(sorted(k for k in os.environ if k.startswith('HOROVOD_')))"],
               env={"HOROVOD_CYCLE_TIME": "2"}, timeout=60)
    assert proc.stdout.strip() == "['HOROVOD_CYCLE_TIME']"
