"""What a layer above the core checks once a job runs, as a neutral interface the core calls.

The core runs without any (:class:`JobChecks` does nothing); :mod:`hvdtrain.trainer` gives every
run started through ``hvdtrain.train``, ``hvdtrain.Trainer``, ``hvdtrain recipe`` or
``hvdtrain.run`` its defaults: the experiment trackers reached from rank 0, the same versions on
every host. Both methods are called by every rank at the same point, so they may hold collectives.
"""

from __future__ import annotations

from typing import Any


class JobChecks:
    """The checks of a run; override either method."""

    def started(self, config: Any, adapter: Any, ctx: Any) -> None:
        """Every rank, right after Horovod starts and the job's rules passed: raise to stop the run
        (every rank alike) before anything is planned or built."""

    def workers(self, adapter: Any) -> str | None:
        """Every rank, once the start is agreed and at each elastic re-form: raise if the workers
        cannot train together, else a line for rank 0 to print (or None)."""
        return None
