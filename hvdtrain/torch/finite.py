"""The finite check of ``train.nonfinite=error`` without a host synchronisation per update.

Deciding on the host whether an update's gradient norm is finite (``if not torch.isfinite(norm)``)
makes the CPU wait for the GPU at every update, so the GPU idles while the next step's kernels are
launched (on an H200 this was hvdtrain's one host synchronisation per step, and ResNet-50 ran at
0.94 of a plain loop). Under ``train.nonfinite=error`` nothing has to be decided per update: the run
stops either way. :class:`DeferredFiniteCheck` keeps, on the device, the first update whose norm was
not finite and reads it once per window of updates (the log interval) and at the end of each epoch.
A non-finite update is applied in between; its weights are never saved, because ``save_state``
refuses parameters that are not finite before writing anything. The error names how many updates
ago the bad one was.
``train.nonfinite=skip`` must decide per update and keeps the synchronous check; so does a CPU, where
reading the norm costs nothing and the error comes at the very update.
"""

from __future__ import annotations

import torch


class DeferredFiniteCheck:
    """Records on the device whether any update's gradient norm was not finite; :meth:`due` says
    when to read it, :meth:`updates_ago` reads it (one host synchronisation)."""

    def __init__(self, device: torch.device, window: int) -> None:
        self.window = max(1, window)
        self._updates = 0  # updates noted so far (a host count: no synchronisation)
        # the 1-based number of the first update whose norm was not finite; 0: none so far
        self._first_bad = torch.zeros((), dtype=torch.int64, device=device)

    def note(self, norm: torch.Tensor) -> None:
        """Record one update's gradient norm (no host synchronisation)."""
        self._updates += 1
        bad = ~torch.isfinite(norm)
        self._first_bad = torch.where(bad & (self._first_bad == 0), self._updates, self._first_bad)

    def due(self) -> bool:
        """True after every ``window`` updates: the caller reads :meth:`updates_ago` then."""
        return self._updates % self.window == 0

    def updates_ago(self) -> int | None:
        """How many updates before the latest one the first non-finite norm came (0: the latest);
        None when every norm so far was finite. Reads the device once."""
        first = int(self._first_bad)
        return None if first == 0 else self._updates - first
