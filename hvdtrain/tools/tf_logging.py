"""TensorFlow without its start-up noise: what every hvdtrain process does before TensorFlow loads.

Importing TensorFlow prints, on every process (each ``horovodrun`` rank, each data worker), lines
written by its C++ libraries while they load: absl's "All log messages before absl::InitializeLog()
is called are written to STDERR", the oneDNN notice ("oneDNN custom operations are on"), twice
(two libraries), and the CPU feature guard's two lines. :func:`install` (called by ``import
hvdtrain``) makes that quiet by default:

* ``TF_CPP_MIN_LOG_LEVEL=1`` (TensorFlow's C++ INFO lines off: the CPU feature guard, XLA's
  "compiled cluster"; its warnings and errors still print), set only when the user has not set it;
* the oneDNN notice and absl's pre-initialisation line ignore that level (they are written while
  the libraries load), so the first ``import tensorflow`` runs with the process's standard error
  (file descriptor 2) sent to a temporary file; afterwards every line of it is written back except
  exactly those start-up lines. A Python warning or a C++ warning or error printed during the
  import still shows, in order; if the import fails, everything is written back.

A user who sets ``TF_CPP_MIN_LOG_LEVEL`` (``0`` to see everything) gets TensorFlow's own behaviour:
nothing is filtered. The default travels to child processes with a marker
(``HVDTRAIN_TF_LOG_DEFAULT``), so a child that inherits hvdtrain's default is still quieted, but a
value the user sets is never taken for hvdtrain's. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

LEVEL_VAR, MARKER_VAR = "TF_CPP_MIN_LOG_LEVEL", "HVDTRAIN_TF_LOG_DEFAULT"
DEFAULT_LEVEL = "1"  # C++ INFO off; WARNING and ERROR on
# The start-up lines that are dropped (nothing else is).
NOISE = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
    re.compile(r"^I\d{4} [\d:. ]+\s+\d+ port\.cc:\d+\] oneDNN custom operations are on\."),
    re.compile(r"^I\d{4} [\d:. ]+\s+\d+ cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"),
    re.compile(r"^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$"),
)


def user_level(environ: Any = None) -> str | None:
    """The ``TF_CPP_MIN_LOG_LEVEL`` the user set, or None when it is unset or hvdtrain's default."""
    environ = os.environ if environ is None else environ
    value = environ.get(LEVEL_VAR)
    if value is None or (environ.get(MARKER_VAR) == value):
        return None
    return value


def is_noise(line: str) -> bool:
    """Whether ``line`` is one of TensorFlow's start-up lines that :func:`install` drops."""
    return any(pattern.search(line) for pattern in NOISE)


@contextmanager
def filtered_stderr() -> Iterator[None]:
    """File descriptor 2 goes to a temporary file inside the block; afterwards its lines are written
    back to the real standard error, without the start-up noise (all of them if the block raised)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable standard error: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as capture:
        failed = True
        try:
            os.dup2(capture.fileno(), 2)
            yield
            failed = False
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            kept = text if failed else "".join(
                line for line in text.splitlines(keepends=True) if not is_noise(line.rstrip("\r\n")))
            if kept:
                os.write(2, kept.encode())


class _QuietLoader:
    """Wraps ``tensorflow``'s loader: its module body runs inside :func:`filtered_stderr`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with filtered_stderr():
            self.loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _QuietFinder:
    """Finds the top-level ``tensorflow`` package once (the first import) and quiets its loading."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        remove()  # one import only; any later lookup is the ordinary one
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _QuietLoader(spec.loader)
        return spec


_FINDER = _QuietFinder()


def remove() -> None:
    """Take the import hook out (it removes itself at the first ``import tensorflow``)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """The quiet default (see the module docstring): ``TF_CPP_MIN_LOG_LEVEL=1`` unless the user set
    it, and, unless the user set it or TensorFlow is already loaded, the first ``import
    tensorflow`` without its start-up lines."""
    if user_level() is not None:
        return
    os.environ[LEVEL_VAR] = os.environ[MARKER_VAR] = DEFAULT_LEVEL
    if "tensorflow" not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
