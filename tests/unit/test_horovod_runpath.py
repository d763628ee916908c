"""scripts/horovod_runpath.py: a cached Horovod wheel's RUNPATH moved to the venv it is installed in."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "horovod_runpath.py"
spec = importlib.util.spec_from_file_location("horovod_runpath", SCRIPT)
horovod_runpath = importlib.util.module_from_spec(spec)
spec.loader.exec_module(horovod_runpath)


def test_another_venvs_folders_move_under_this_venv():
    old = "/tmp/ci17/.venv/lib:/tmp/ci17/.venv/lib/python3.11/site-packages/torch/lib"
    assert horovod_runpath.relocated(old, Path("/work/main/.venv")) == (
        "/work/main/.venv/lib:/work/main/.venv/lib/python3.11/site-packages/torch/lib")


def test_this_venvs_folders_and_system_folders_are_kept(tmp_path):
    venv = tmp_path / "venv"
    system = tmp_path / "usr-openmpi"
    (system / "lib").mkdir(parents=True)
    kept = f"{venv}/lib:$ORIGIN/../lib:{system}/lib"
    assert horovod_runpath.relocated(kept, venv) == kept


def test_another_existing_venv_moves_too(tmp_path):
    other = tmp_path / "other"
    (other / "lib").mkdir(parents=True)
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")
    venv = tmp_path / "venv"
    assert horovod_runpath.relocated(f"{other}/lib", venv) == f"{venv}/lib"
