"""A one-line progress bar on rank 0 with throughput and ETA (``train.progress_bar``).

It draws only when its stream is a terminal and the process was not started by a launcher, so
logs, pipes, ``horovodrun``'s forwarded output and notebooks stay clean: Open MPI (which
``horovodrun`` uses when it is installed) gives every worker a pseudo-terminal and prefixes and
forwards what it writes, so a bar's redraws would land in the log. Under a launcher the
``train.log_every`` lines (:class:`~hvdtrain.core.visibility.StepLog`) are the progress report;
``HVDTRAIN_PROGRESS_BAR=1`` asks for the bar anyway (``=0`` never draws it). It clears itself
before such a line or an epoch summary is printed, so those lines are never garbled.

Drawn here rather than with ``tqdm`` (measured 2026-11-28, tqdm 4.70.1, a loaded machine): a tqdm
version is about 27 lines against these 56, but tqdm is no dependency of hvdtrain (it comes only
with the ``text`` extra's Hugging Face packages), its import took 0.25 to 0.4 s, and it shows a
throughput and an ETA of its own (steps per second, smoothed its way) beside the trainer's
samples/s, where this bar shows the figure the log lines print and an ETA from the epoch's own
pace; matching that takes a custom ``bar_format``, which gives most of the lines back.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from hvdtrain.core.callbacks import Callback
from hvdtrain.launch.detect import under_launcher

CLEAR_LINE = "\r\x1b[K"


def bar_wanted(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """Whether to draw on ``stream``: ``HVDTRAIN_PROGRESS_BAR`` 1/0 decides if set; otherwise only
    on a terminal outside a launcher (:func:`hvdtrain.launch.detect.under_launcher`: every launcher
    forwards, and prefixes, its workers' output)."""
    environ = os.environ if environ is None else environ
    forced = environ.get("HVDTRAIN_PROGRESS_BAR", "").strip().lower()
    if forced in ("1", "true", "yes", "always"):
        return True
    if forced in ("0", "false", "no", "never"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) and not under_launcher(environ)


def format_duration(seconds: float) -> str:
    """``1:02:03`` or ``2:03``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def render_bar(epoch: int, epochs: int, done: int, total: int, loss: float, rate: float, eta_sec: float,
               width: int = 24) -> str:
    """The bar's text, e.g. ``epoch 1/2 [#####-----]  45% 210/469 loss 0.1234 1234 samples/s ETA 0:21``."""
    fraction = done / total if total else 1.0
    filled = int(round(fraction * width))
    return (f"epoch {epoch}/{epochs} [{'#' * filled}{'-' * (width - filled)}] {fraction:4.0%} {done}/{total} "
            f"loss {loss:.4f} {rate:,.0f} samples/s ETA {format_duration(eta_sec)}")


class ProgressBar(Callback):
    """Rank 0 redraws the bar at most every ``min_interval`` seconds, only on a terminal and not
    under a launcher (see :func:`bar_wanted`)."""

    def __init__(self, stream: TextIO | None = None, min_interval: float = 0.1):
        self.stream = stream
        self.min_interval = min_interval
        self.active = False
        self._shown = False

    def on_train_begin(self, ctx: Any, info: dict[str, Any]) -> None:
        self.stream = self.stream or sys.stdout
        self.active = bool(ctx.is_main and bar_wanted(self.stream))
        self.epochs = info["config"].train.epochs
        self.log_every = info["config"].train.log_every
        self._epoch_started = time.perf_counter()
        self._last_draw = 0.0

    def on_step_end(self, epoch: int, step: int, logs: dict[str, Any]) -> None:
        if not self.active:
            return
        done, total = step + 1, logs["steps"]
        if self.log_every and done % self.log_every == 0:  # StepLog prints a line right after this
            self._clear()
            return
        now = time.perf_counter()
        if now - self._last_draw < self.min_interval and done != total:
            return
        elapsed = now - self._epoch_started
        eta = elapsed / done * (total - done)
        self.stream.write(CLEAR_LINE + render_bar(epoch + 1, self.epochs, done, total, logs["loss"],
                                                  logs["samples_per_sec"], eta))
        self.stream.flush()
        self._shown, self._last_draw = True, now

    def on_epoch_end(self, epoch: int, record: dict[str, Any]) -> None:
        if self.active:
            self._clear()
        self._epoch_started = time.perf_counter()

    def on_train_end(self, result: Any) -> None:
        if self.active:
            self._clear()

    def _clear(self) -> None:
        if self._shown:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()
            self._shown = False
