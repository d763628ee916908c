"""Where TensorFlow's batches become tensors: ``overhead.py tensorflow`` with its rounds alternating
(A B B A A B B A ...) between the conversion on the loop's thread, between steps (A: the adapter's
``convert_batch`` left at the base class's "as loaded", so the step converts, as before 2026-11-28),
and in the prefetch thread (B: hvdtrain's default now). Each round records, as ``overhead.py`` does,
hvdtrain's and the hand-written loop's step times and their main threads' CPU per step.

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/workers/batch_conversion.py OUT.json --rounds 12

(``PYTHONPATH=.:benchmarks:benchmarks/workers``.) Round ``i`` converts in the prefetch thread when
``(i + 1) // 2`` is odd.
"""

from __future__ import annotations

import sys

import overhead
from hvdtrain.core.adapter import FrameworkAdapter
from hvdtrain.tensorflow.adapter import TensorFlowAdapter

IN_PREFETCH_THREAD = TensorFlowAdapter.convert_batch


class Alternating(overhead.Interleave):
    """The interleaving clock of one round; choosing, as the round starts, where it converts."""

    rounds = 0

    def __init__(self, others: dict):
        prefetch_thread = (Alternating.rounds + 1) // 2 % 2 == 1
        TensorFlowAdapter.convert_batch = IN_PREFETCH_THREAD if prefetch_thread else FrameworkAdapter.convert_batch
        where = "in the prefetch thread" if prefetch_thread else "on the loop's thread"
        print(f"round {Alternating.rounds}: batches converted {where}", flush=True)
        Alternating.rounds += 1
        super().__init__(others)


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "tensorflow", *sys.argv[1:]]
    overhead.Interleave = Alternating
    overhead.main()
