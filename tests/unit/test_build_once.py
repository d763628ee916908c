"""hvdtrain.data.build_once: one builder per host, the others find its result."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from hvdtrain.data.build_once import build_once, file_lock


def _race(folder: str, barrier) -> bool:
    entry, log = os.path.join(folder, "entry"), os.path.join(folder, "builds.log")

    def build():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        os.makedirs(entry + ".tmp")
        os.rename(entry + ".tmp", entry)  # published whole

    barrier.wait()  # both look before either builds
    return build_once(os.path.join(folder, "entry.lock"), lambda: entry if os.path.isdir(entry) else None, build)[1]


def test_two_processes_build_it_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_race, args=(str(tmp_path), barrier)) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert len((tmp_path / "builds.log").read_text().split()) == 1
    assert (tmp_path / "entry").is_dir()


def test_found_entries_are_not_built_and_a_lost_one_is_named(tmp_path):
    calls = []
    assert build_once(tmp_path / "a.lock", lambda: "there", lambda: calls.append(1)) == ("there", False)
    assert build_once(tmp_path / "b.lock", lambda: "there" if calls else None, lambda: calls.append(1),
                      look_first=False) == ("there", True)
    with pytest.raises(OSError, match="c.lock cannot be read back"):
        build_once(tmp_path / "c.lock", lambda: None, lambda: None)


def test_the_lock_file_and_its_folder_are_made(tmp_path):
    with file_lock(tmp_path / "deep" / "x.lock"), file_lock(tmp_path / "deep" / "y.lock", shared=True):
        assert (tmp_path / "deep" / "x.lock").is_file()
