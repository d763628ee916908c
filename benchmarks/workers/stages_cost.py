"""Cost of pipeline stages against pure data parallelism: memory, throughput, transfer time.

One launch trains a recipe (the image recipe unless ``--recipe NAME``) once with the given overrides
and rank 0 writes a JSON line::

    horovodrun -np 4 -H localhost:4 --gloo python benchmarks/workers/stages_cost.py OUT.jsonl LABEL \\
        --set model.name=resnet18 --set parallel.pipeline_stages=2 --set parallel.micro_batches=4 ...
    horovodrun -np 4 -H localhost:4 --gloo python benchmarks/workers/stages_cost.py OUT.jsonl LABEL \\
        --recipe bert-finetune --set parallel.pipeline_stages=2 --set data.max_train_samples=256 ...

Per rank: parameters + gradients + optimizer state bytes held by that rank (its stage's parameters
with pipeline stages; gradients counted at their size, they exist during every update), peak
resident memory (``ru_maxrss``) and resident memory after imports (the runtime's floor). Throughput:
global samples/s between the end of the 3rd step and the last step (rank 0's clock). With
``comm.timeline`` set, the time rank 0 spent in the pipeline's activation/gradient transfers
(``hvdtrain.pipe.fwd/bwd`` alltoalls) and in gradient allreduces, per step.
"""

import json
import resource
import sys
import time

import horovod.torch as hvd
import torch

import hvdtrain
from hvdtrain.tools import timeline
from hvdtrain.core.callbacks import Callback

out_path, label, args = sys.argv[1], sys.argv[2], sys.argv[3:]
recipe_name = "image-classification"
if args[:1] == ["--recipe"]:
    recipe_name, args = args[1], args[2:]
overrides = [a for a in args if a != "--set"]
floor_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class StepClock(Callback):
    """Wall time at the end of every step."""

    def __init__(self):
        self.times = []

    def on_step_end(self, epoch, step, logs):
        self.times.append(time.perf_counter())


def state_bytes(adapter):
    """Parameters + gradients + optimizer state this rank holds."""
    params = [p for g in adapter.optimizer.param_groups for p in g["params"] if p.device.type != "meta"]
    n = sum(p.numel() * p.element_size() for p in params)
    opt = sum(t.numel() * t.element_size() for st in adapter.optimizer.state.values()
              for t in st.values() if torch.is_tensor(t) and t.dim() > 0)
    return {"param_bytes": n, "grad_bytes": n, "optimizer_bytes": opt, "total_bytes": 2 * n + opt}


recipe = hvdtrain.get_recipe(recipe_name)
config = hvdtrain.load_config(recipe.defaults, overrides=overrides, recipe=recipe_name, framework="torch")
clock = StepClock()
trainer = hvdtrain.Trainer(config, callbacks=[clock])
result = trainer.fit()
ctx = trainer.ctx
mine = {"rank": ctx.rank, **state_bytes(trainer.adapter), "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "rss_after_imports_kib": floor_kib}
everyone = hvd.allgather_object(mine)
if ctx.rank == 0:
    steps = len(clock.times)
    global_batch = config.train.batch_size * ctx.data_size
    rate = (steps - 3) * global_batch / (clock.times[-1] - clock.times[2])
    row = {"label": label, "recipe": recipe_name, "overrides": overrides, "world_size": ctx.size, "replicas": ctx.data_size,
           "global_batch": global_batch, "steps": steps, "samples_per_sec": rate, "ranks": everyone,
           "val_accuracy": result.final.get("val_accuracy")}
    if config.comm.timeline:
        acts = timeline.collectives(timeline.activities(timeline.load_events(config.comm.timeline)))
        pipe = [a for a in acts if ".hvdtrain.pipe.fwd" in a.tensor or ".hvdtrain.pipe.bwd" in a.tensor]
        grads = [a for a in acts if "hvdtrain.pipe.grads" in a.tensor or a.tensor.startswith("allreduce.")
                 and "pipe" not in a.tensor and "allreduce_sums" not in a.tensor]
        row["transfer_sec_per_step"] = timeline.covered_seconds([(a.start, a.end) for a in pipe]) / steps
        row["transfers"] = len(pipe)
        row["transfer_bytes"] = sum(a.nbytes for a in pipe)
        row["grad_allreduce_sec_per_step"] = timeline.covered_seconds([(a.start, a.end) for a in grads]) / steps
        row["step_sec"] = (clock.times[-1] - clock.times[2]) / (steps - 3)
    with open(out_path, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k != "ranks"}))
