"""Turn a stuck collective into an error: Horovod's stall inspector, configured before ``hvd.init``.

When one rank stops calling collectives (it hangs, or it skipped a step), the others wait forever
in the next allreduce. Horovod's coordinator notices tensors that only some ranks submitted: after
``HOROVOD_STALL_CHECK_TIME_SECONDS`` it logs which ranks are missing, and after
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` it shuts Horovod down, which makes every pending
collective raise. :func:`configure_stall_timeout` sets both from ``train.stall_timeout_sec``.
"""

from __future__ import annotations

import os


def configure_stall_timeout(seconds: float | None) -> None:
    """Warn (naming the missing ranks) after half of ``seconds`` and shut down after ``seconds``."""
    if seconds is None:
        return
    os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(max(1, int(seconds // 2)))
    os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(max(2, int(seconds)))


def explain_stall(exc: BaseException, seconds: float | None) -> str | None:
    """A clear message if ``exc`` is Horovod shutting down after a stall, else None."""
    text = str(exc)
    if seconds is not None and ("shut down" in text.lower() or "shutdown" in text.lower()):
        return (f"a collective operation waited longer than train.stall_timeout_sec={seconds:g}s, so Horovod "
                f"shut down; its stall report above names the ranks that did not arrive ({text.strip()})")
    return None
