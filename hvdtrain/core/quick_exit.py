"""A shorter interpreter shutdown for processes that loaded a framework.

After the last ``atexit`` handler CPython tears the interpreter down: it clears every module and
runs its cycle collector again and again over what is left. With TensorFlow and Horovod loaded
that is ~360,000 tracked objects, and the teardown alone costs about 1.1 CPU-seconds (torch: ~0.6),
paid by every rank of every job after training has ended.

:func:`install` (called by ``hvdtrain.torch`` and ``hvdtrain.tensorflow`` on import, so by every
process that loads an adapter) registers, before the framework is imported (so it runs after the
framework's own ``atexit`` handlers, which run last-registered first), one handler that collects the garbage there
is once -- finalizers of unreachable objects run and unclosed files are flushed as they would be --
and then freezes the survivors (:func:`gc.freeze`): the teardown's collections skip them, which
leaves it at ~0.3 CPU-seconds (TensorFlow) and ~0.25 (torch). Nothing else changes: every
``atexit`` handler still runs, objects still reachable at exit are released by reference count as
before, and a process that never calls :func:`install` shuts down as usual. The one difference:
an object still reachable at exit that sits in a reference cycle is not finalized by the teardown
(CPython does not promise that either: close files and writers in ``on_train_end``, not ``__del__``).
"""

from __future__ import annotations

import atexit
import gc

_installed = False


def install() -> None:
    """Register the collect-then-freeze exit handler once per process (later calls do nothing)."""
    global _installed
    if not _installed:
        _installed = True
        atexit.register(_collect_then_freeze)


def _collect_then_freeze() -> None:
    gc.collect()
    gc.freeze()
