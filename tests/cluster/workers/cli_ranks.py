"""Worker for tests/cluster: run the `hvdtrain` command line in this rank (the exact code path of
`hvdtrain recipe ...`), then compare every rank's trained parameters and host name.

Usage (under horovodrun): ``cli_ranks.py REPORT_PATH FRAMEWORK -- HVDTRAIN_ARGS...``. Rank 0
writes REPORT_PATH (JSON): per rank its host name and the SHA-256 of its parameters' bytes.
"""

import hashlib
import json
import socket
import sys

import numpy as np

import hvdtrain.core.loop as loop
from hvdtrain.cli import main

trainers = []
fit = loop.Trainer.fit


def recording_fit(self):
    trainers.append(self)  # keep the trainer the CLI builds, to read its model afterwards
    return fit(self)


def main_ranks() -> None:
    """Train through the CLI in this rank, then rank 0 writes every rank's host and parameter digest."""
    report_path, framework = sys.argv[1], sys.argv[2]
    argv = sys.argv[sys.argv.index("--") + 1:]

    loop.Trainer.fit = recording_fit
    try:
        main(argv, standalone_mode=False)
    finally:
        loop.Trainer.fit = fit

    adapter = trainers[0].adapter
    if framework == "torch":
        arrays = [p.detach().numpy() for p in adapter.model.parameters()]
    else:
        arrays = [np.asarray(v.numpy()) for v in adapter.model.trainable_variables]
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(a, np.float32).tobytes() for a in arrays)).hexdigest()
    ctx = adapter.context()
    ranks = adapter.allgather_object({"host": socket.gethostname(), "params_sha256": digest, "rank": ctx.rank})
    if ctx.rank == 0:
        with open(report_path, "w") as f:
            json.dump({"size": ctx.size, "ranks": ranks}, f)


# the data pipeline's workers are spawned and import this file as __mp_main__: without the guard
# each of them would run the training again (and call MPI_Init from inside a rank)
if __name__ == "__main__":
    main_ranks()
