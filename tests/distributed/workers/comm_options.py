"""Worker for tests/distributed/test_bench.py: train the image recipe with config overrides, then
report every rank's parameter fingerprint and the final metrics.

    horovodrun -np 2 -H localhost:2 --mpi python comm_options.py REPORT.json FRAMEWORK KEY=VALUE ...
"""

import json
import sys

import hvdtrain
from fingerprints import fingerprint


def main():
    report, framework, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    config = hvdtrain.load_config(hvdtrain.get_recipe("image-classification").defaults, overrides=overrides,
                                  recipe="image-classification", framework=framework)
    trainer = hvdtrain.Trainer(config)
    result = trainer.fit()
    prints = trainer.adapter.allgather_object(fingerprint(trainer.adapter, framework))
    if trainer.ctx.is_main:
        with open(report, "w") as f:
            json.dump({"world_size": result.world_size, "fingerprints": prints, "history": result.history}, f)


if __name__ == "__main__":
    main()
