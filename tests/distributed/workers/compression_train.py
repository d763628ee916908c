"""Worker for tests/distributed/test_compression.py: train the image recipe with a compression or
local-SGD option and, after every optimizer step, compare every rank's parameters: they must be
identical whenever the replicas are in sync (always with PowerSGD/top-k; right after each
averaging with local SGD). Writes the history and the counts to REPORT.json on rank 0.

    horovodrun -np 2 -H localhost:2 --gloo python compression_train.py REPORT.json FRAMEWORK KEY=VALUE ...
"""

import json
import sys

import numpy as np

import hvdtrain
from fingerprints import fingerprint
from hvdtrain.core.callbacks import Callback


def in_sync(adapter, framework):
    """Whether this run's replicas should be equal now."""
    exchange = adapter.exchange
    if exchange.plan is None or exchange.plan.method != "local_sgd":
        return True
    return int(np.asarray(exchange.since_average)) == 0  # a Python int (torch) or a tf.Variable


class ReplicaCheck(Callback):
    """Compares the ranks' parameters after every step (a collective: every rank runs it)."""

    def __init__(self, framework):
        self.trainer, self.framework = None, framework
        self.counts = {"synced_steps": 0, "synced_mismatches": 0, "local_steps": 0, "local_differ": 0}

    def on_step_end(self, epoch, step, logs):
        adapter = self.trainer.adapter
        prints = adapter.allgather_object((in_sync(adapter, self.framework), fingerprint(adapter, self.framework)))
        synced = prints[0][0]
        assert all(p[0] == synced for p in prints), "ranks disagree about the averaging phase"
        same = len({p[1] for p in prints}) == 1
        if synced:
            self.counts["synced_steps"] += 1
            self.counts["synced_mismatches"] += int(not same)
        else:
            self.counts["local_steps"] += 1
            self.counts["local_differ"] += int(not same)


def main():
    report, framework, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    config = hvdtrain.load_config(hvdtrain.get_recipe("image-classification").defaults, overrides=overrides,
                                  recipe="image-classification", framework=framework)
    check = ReplicaCheck(framework)
    trainer = check.trainer = hvdtrain.Trainer(config, callbacks=[check])
    result = trainer.fit()
    prints = trainer.adapter.allgather_object(fingerprint(trainer.adapter, framework))
    if trainer.ctx.is_main:
        with open(report, "w") as f:
            json.dump({"world_size": result.world_size, "final_fingerprints": prints, "history": result.history,
                       **check.counts}, f)


if __name__ == "__main__":
    main()
