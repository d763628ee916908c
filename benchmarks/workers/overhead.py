"""Items 1 and 2: hvdtrain's training throughput next to the minimal hand-written Horovod loop.

Both sides run in this process, alternating (the order flips every round), on the same in-memory
MNIST arrays, model, batch and seed, one intra-op thread per rank; each side's throughput is
measured from the end of step ``SKIP_STEPS`` to the last step of one epoch.

    horovodrun -np 2 -H localhost:2 python benchmarks/workers/overhead.py torch OUT.json --rounds 5
    (--sides hvdtrain: only the hvdtrain side, for the comparison with torchrun + DDP;
     side hvdtrain_overlap: hvdtrain with comm.overlap=always, Horovod's per-gradient overlap)
"""

from __future__ import annotations

import argparse
import importlib
import tempfile

import common  # noqa: F401  (puts the repository on sys.path)
import hvdtrain
from common import BATCH, StepClock, hvdtrain_overrides, mnist_arrays, register_memory_recipe, steady_rate


class ClockCallback(hvdtrain.Callback):
    """Records the end of every hvdtrain step."""

    def __init__(self, clock: StepClock):
        self.clock = clock

    def on_step_end(self, epoch, step, logs):
        self.clock.tick()


def hvdtrain_rate(framework: str, output: str, **extra) -> float:
    """One epoch through hvdtrain.train(); this rank's steady samples/s."""
    config = hvdtrain.load_config(None, overrides=hvdtrain_overrides(output, **extra), recipe=common.MEMORY_RECIPE,
                                  framework=framework)
    clock = StepClock()
    hvdtrain.train(config, callbacks=[ClockCallback(clock)])
    return steady_rate(clock.ends, BATCH)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=("torch", "tensorflow"))
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--sides", default="hvdtrain,baseline")
    args = parser.parse_args()
    torch_layout = args.framework == "torch"
    arrays = mnist_arrays(args.samples, channels_first=torch_layout)
    register_memory_recipe({args.framework: arrays})
    baseline = importlib.import_module("horovod_torch_loop" if torch_layout else "horovod_tf_loop")
    hvd = importlib.import_module("horovod.torch" if torch_layout else "horovod.tensorflow")
    sides = args.sides.split(",")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for r in range(args.rounds):
            rates = {}
            for side in (sides if r % 2 == 0 else sides[::-1]):
                if side == "hvdtrain":
                    rates[side] = hvdtrain_rate(args.framework, f"{tmp}/round{r}")
                elif side == "hvdtrain_overlap":
                    rates[side] = hvdtrain_rate(args.framework, f"{tmp}/overlap{r}", **{"comm.overlap": "always"})
                else:
                    rates[side] = steady_rate(baseline.train_epoch(arrays[0], arrays[1]), BATCH)
            per_rank = hvd.allgather_object(rates)  # distributed
            rounds.append({side: sum(p[side] for p in per_rank) / len(per_rank) for side in sides})
            if hvd.rank() == 0:
                print(f"round {r}: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[-1].items()), flush=True)
    if hvd.rank() == 0:
        common.write_json(args.out, {"framework": args.framework, "world_size": hvd.size(), "samples": args.samples,
                                     "batch": BATCH, "rounds": rounds})


if __name__ == "__main__":
    main()
