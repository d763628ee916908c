"""``python eval_checkpoint.py OUTPUT CHECKPOINT REPORT``: one process evaluates a saved checkpoint.

Rebuilds the run's task from OUTPUT/config.yaml (Horovod of size 1), loads the checkpoint's model
and evaluates the whole validation set in one pass of its own (batches of 7, another split than
the training run's), writing ``{"loss": ..., "accuracy": ...}``.
"""

import json
import sys
from pathlib import Path

import numpy as np

from hvdtrain.core.adapter import load_adapter
from hvdtrain.core.resolve import load_config
from hvdtrain.core.registry import get_builder

OUTPUT, CHECKPOINT, REPORT = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
config = load_config(file=OUTPUT / "config.yaml")
adapter = load_adapter(config.framework)
ctx = adapter.init(config)
task = get_builder(config.recipe, config.framework)(config, ctx)
adapter.prepare(task, config)
adapter.load_state(CHECKPOINT)
sums = {}
for start in range(0, len(task.val_data), 7):
    inputs, targets = task.val_data.get_batch(np.arange(start, min(start + 7, len(task.val_data))), -1)
    for key, value in adapter.eval_step(inputs, targets).items():
        sums[key] = sums.get(key, 0.0) + float(value)
with open(REPORT, "w") as f:
    json.dump({"loss": sums["loss_sum"] / sums["count"], **task.finalize_metrics(sums)}, f)
