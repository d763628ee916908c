"""Compiled training steps (``train.compile``): what both frameworks share.

``train.compile`` is ``none`` (eager, the default) or a :data:`MODES` entry. What each framework
compiles, and why there (measured in ``benchmarks/compile_speed.py``):

* PyTorch (:mod:`hvdtrain.torch.compiled`): ``torch.compile`` (Inductor, in the mode named) of the
  model, so its forward and backward run compiled; the compiled module shares the model's
  parameters, so Horovod's gradient hooks (on each parameter's gradient accumulator) still fire
  when the compiled backward hands over the gradients, and every exchange, the optimizer update,
  the checkpoint (no ``_orig_mod.`` prefix: the model saved is the original) and BatchNorm sync
  run exactly as eagerly.
* TensorFlow (:mod:`hvdtrain.tensorflow.compiled`): the forward and ``tape.gradient`` in an inner
  ``tf.function(jit_compile=True)`` (XLA); Horovod's collectives (XLA operations only in Horovod's
  GPU builds, with ``HOROVOD_ENABLE_XLA_OPS=1``) and the update stay outside it in the step's
  ``tf.function``. XLA has no modes: ``default`` is the value for TensorFlow (the
  rulebook refuses the torch-only modes rather than run a different thing than the name says).

Compilation happens on the first step; :class:`FirstStepClock` reports how long that step took
(one line on rank 0).

On a CPU (measured with ``benchmarks/compile_speed.py``, one thread per rank): a compiled step
runs the same oneDNN convolutions and MKL matrix products as the eager one, and those are most of
the step (ResNet-50: 78%), so compiling can only shorten the rest (BatchNorm, activations,
additions, dropout): ResNet-50's ceiling is 1/0.78 = 1.28 even if that rest took no time.
PyTorch: Inductor fuses the rest (ResNet-50 about 1.13 of eager's samples per CPU-second) and, on
CPU, runs dropout through ATen's kernels (:data:`hvdtrain.torch.compiled.DEVICE_OPTIONS`; with
Inductor's own per-element generator BERT ran at 0.80-0.83 of eager, with ATen's at 1.00-1.17).
TensorFlow: XLA's CPU convolutions are much slower than TensorFlow's oneDNN kernels (ResNet-50 0.65
of eager, ResNet-18 0.18) and BERT gains nothing (0.92): on a CPU, TensorFlow runs faster eagerly.
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: ``train.compile`` values that compile (``none`` runs eagerly); the torch.compile modes.
MODES = ("default", "reduce-overhead", "max-autotune")
#: The modes only ``torch.compile`` has (TensorFlow's XLA has one way to compile).
TORCH_ONLY_MODES = ("reduce-overhead", "max-autotune")


def compiling(config: Any) -> bool:
    """Whether ``config`` asks for a compiled step."""
    return config.train.compile != "none"


class FirstStepClock:
    """Times the first training step, where the compiler runs, and prints one line on rank 0:
    ``hvdtrain: compiled the step in X s (<what>)``. ``what=None`` (an eager step) never reports.
    The adapter calls :meth:`start` at the start of every step and :meth:`stop` at its end; after
    the first step both only test one attribute."""

    def __init__(self, what: str | None = None, rank: int = 0, stream: Any = None) -> None:
        self.what = what
        self.rank = rank
        self.stream = stream
        self.seconds: float | None = None
        self._started: float | None = None
        self._done = what is None

    def start(self) -> None:
        """A step starts (timed while the first has not ended)."""
        if not self._done and self._started is None:
            self._started = time.perf_counter()

    def stop(self) -> None:
        """A step ended: the first one's time is reported."""
        if self._done or self._started is None:
            return
        self.seconds = time.perf_counter() - self._started
        self._done = True
        if self.rank == 0:
            print(f"hvdtrain: compiled the step in {self.seconds:.1f} s ({self.what})",
                  file=self.stream or sys.stdout, flush=True)
