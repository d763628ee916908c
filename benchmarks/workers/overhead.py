"""Items 1 and 2: hvdtrain's training throughput next to the hand-written loops, step by step.

Each round is one epoch of ``hvdtrain.train()`` (the real trainer with its defaults) on in-memory
MNIST. After every hvdtrain step a callback runs one step of each other side: the minimal
hand-written Horovod loop (same model, data, batch, seed) and, for torch with ``--ddp``, PyTorch
DistributedDataParallel over Gloo. The sides alternate step by step, so the machine's load hits
them alike; each side's time is its own steps only (hvdtrain's step i is the time from the end
of the callback after step i-1 to the end of step i: data, LR, hooks and logging included).
Rounds alternate hvdtrain's comm.overlap between its default (``auto``) and ``always``, or with
``--vary KEY=A,B`` any other setting (each round records ``vary``: the ``KEY=VALUE`` in force), in
the order A B B A A B B A ...: each value falls on even and odd rounds alike (rounds that simply
alternate put one value on every even round, and consecutive rounds can differ by a few percent
with nothing varied).
Each round also records, per rank and side (``detail``), the wall and CPU time per timed step (the
process's, all threads, and the main thread's) and the garbage collector's pauses inside them:
what separates work a side adds from time it waits (for the other rank, or for a core).

    horovodrun -np 2 -H localhost:2 python benchmarks/workers/overhead.py torch OUT.json --rounds 10 --ddp
    horovodrun -np 2 -H localhost:2 python benchmarks/workers/overhead.py torch OUT.json --rounds 10 --ddp \
        --vary comm.flat_gradients=true,false     # flat gradient buffers against DistributedOptimizer
    horovodrun -np 2 -H localhost:2 python benchmarks/workers/overhead.py tensorflow OUT.json --rounds 6 \
        --keras-fit                               # Keras model.fit through hvdtrain.keras (keras_fit_loop.py)
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import resource
import tempfile
import time

import common  # noqa: F401  (puts the repository on sys.path)
import hvdtrain
from common import BATCH, SKIP_STEPS, hvdtrain_overrides, mnist_arrays, register_memory_recipe


#: Horovod's tuning variables a sweep sets around the job (recorded with the results).
TUNING = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CACHE_CAPACITY", "HOROVOD_AUTOTUNE")


class Interleave(hvdtrain.Callback):
    """After each hvdtrain step, one step of every other side; records everyone's step times, the
    CPU time of this process during each side's steps (all its threads: the prefetch and Horovod
    threads too) and the garbage collector's pauses that fell inside each side's steps."""

    def __init__(self, others: dict):
        self.others = others
        sides = ["hvdtrain", *others]
        self.times: dict[str, list[float]] = {name: [] for name in sides}
        self.cpu: dict[str, list[float]] = {name: [] for name in sides}
        self.main_cpu: dict[str, list[float]] = {name: [] for name in sides}  # this (the main) thread's only
        self.gc_pauses: dict[str, list[tuple[int, int, float]]] = {name: [] for name in sides}  # (step, gen, s)
        self.faults: dict[str, list[int]] = {name: [] for name in sides}  # the process's minor page faults
        self.side = "hvdtrain"
        self._gc_started = 0.0
        self.resumed, self.resumed_cpu, self.resumed_main = time.perf_counter(), time.process_time(), time.thread_time()
        self.resumed_faults = minor_faults()

    def on_gc(self, phase: str, info: dict) -> None:
        """``gc.callbacks`` entry: the pause, charged to the side whose step is running."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            step = len(self.times[self.side])  # the step of that side now running
            self.gc_pauses[self.side].append((step, info["generation"], time.perf_counter() - self._gc_started))

    def on_step_end(self, epoch, step, logs):
        self.times["hvdtrain"].append(time.perf_counter() - self.resumed)
        self.cpu["hvdtrain"].append(time.process_time() - self.resumed_cpu)
        self.main_cpu["hvdtrain"].append(time.thread_time() - self.resumed_main)
        self.faults["hvdtrain"].append(minor_faults() - self.resumed_faults)
        names = list(self.others) if step % 2 == 0 else list(self.others)[::-1]
        for name in names:
            self.side = name
            started, started_cpu, started_main = time.perf_counter(), time.process_time(), time.thread_time()
            started_faults = minor_faults()
            next(self.others[name])
            self.times[name].append(time.perf_counter() - started)
            self.cpu[name].append(time.process_time() - started_cpu)
            self.main_cpu[name].append(time.thread_time() - started_main)
            self.faults[name].append(minor_faults() - started_faults)
        self.side = "hvdtrain"
        self.resumed, self.resumed_cpu, self.resumed_main = time.perf_counter(), time.process_time(), time.thread_time()
        self.resumed_faults = minor_faults()


def minor_faults() -> int:
    """This process's minor page faults so far (memory the kernel maps on first touch: what an
    allocator that returns freed memory to the system pays again at every step)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def window_detail(clock: Interleave) -> dict:
    """Per side, over the timed steps (after the first ``SKIP_STEPS``): wall time per step, this
    process's CPU time per step (all threads, and the main thread's), and the garbage collector's pauses inside them
    (all, and full collections)."""
    detail = {}
    for side, times in clock.cpu.items():
        timed, main = times[SKIP_STEPS:], clock.main_cpu[side][SKIP_STEPS:]
        pauses = [(gen, sec) for step, gen, sec in clock.gc_pauses[side] if step >= SKIP_STEPS]
        wall, faults = clock.times[side][SKIP_STEPS:], clock.faults[side][SKIP_STEPS:]
        detail[side] = {"wall_ms": 1000 * sum(wall) / max(1, len(wall)), "cpu_ms": 1000 * sum(timed) / max(1, len(timed)),
                        "main_cpu_ms": 1000 * sum(main) / max(1, len(main)), "gc_ms": 1000 * sum(s for _, s in pauses),
                        "gc_count": len(pauses), "gc_full": sum(1 for gen, _ in pauses if gen == 2),
                        "faults": sum(faults) / max(1, len(faults))}
    return detail


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=("torch", "tensorflow"))
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=10, help="epochs; comm.overlap alternates auto/always")
    parser.add_argument("--samples", type=int, default=4096, help="per round (32 steps of 64 per worker at np=2)")
    parser.add_argument("--ddp", action="store_true", help="torch: also interleave DistributedDataParallel steps")
    parser.add_argument("--keras-fit", action="store_true",
                        help="tensorflow: also interleave Keras model.fit steps through hvdtrain.keras")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra hvdtrain config override (ablations, e.g. train.tensorboard=false)")
    parser.add_argument("--vary", default="comm.overlap=auto,always", metavar="KEY=A,B",
                        help="the hvdtrain setting rounds alternate between (A B B A A B B A ...)")
    args = parser.parse_args()
    vary_key, _, vary_values = args.vary.partition("=")
    vary_values = vary_values.split(",")
    if not vary_key or len(vary_values) != 2:
        parser.error(f"--vary {args.vary!r}: expected KEY=A,B")
    torch_layout = args.framework == "torch"
    arrays = mnist_arrays(args.samples, channels_first=torch_layout)
    register_memory_recipe({args.framework: arrays})
    hvd = importlib.import_module("horovod.torch" if torch_layout else "horovod.tensorflow")
    baseline = importlib.import_module("horovod_torch_loop" if torch_layout else "horovod_tf_loop")
    others = {"baseline": baseline.train_steps(arrays[0], arrays[1])}
    if args.ddp:
        import ddp_torch_loop

        hvd.init()
        common.init_torch_gloo_group(hvd, "bench.ddp_port")
        others["ddp"] = ddp_torch_loop.train_steps(arrays[0], arrays[1])
    if args.keras_fit:
        import keras_fit_loop

        others["keras_fit"] = keras_fit_loop.train_steps(arrays[0], arrays[1])
    for steps in others.values():  # build the models, trace, warm up: not timed
        for _ in range(SKIP_STEPS):
            next(steps)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="hvdtrain-bench-") as tmp:
        for r in range(args.rounds):
            value = vary_values[(r + 1) // 2 % 2]  # A B B A A B B A ...
            overlap = value if vary_key == "comm.overlap" else "auto"
            overrides = hvdtrain_overrides(f"{tmp}/round{r}", **{"comm.overlap": overlap, vary_key: value}) + args.set
            config = hvdtrain.load_config(None, overrides=overrides,
                                          recipe=common.MEMORY_RECIPE, framework=args.framework)
            clock = Interleave(others)
            gc.callbacks.append(clock.on_gc)
            try:
                hvdtrain.train(config, callbacks=[clock])
            finally:
                gc.callbacks.remove(clock.on_gc)
            rates = {name: BATCH * len(t[SKIP_STEPS:]) / sum(t[SKIP_STEPS:]) for name, t in clock.times.items()}
            steps_ms = {name: [round(1000 * t, 3) for t in times[SKIP_STEPS:]] for name, times in clock.times.items()}
            per_rank = hvd.allgather_object({"rates": rates, "detail": window_detail(clock),  # distributed
                                             "steps_ms": steps_ms})
            rounds.append({"overlap": overlap, "vary": f"{vary_key}={value}",
                           **{k: sum(p["rates"][k] for p in per_rank) / len(per_rank) for k in rates},
                           "detail": [p["detail"] for p in per_rank], "steps_ms": [p["steps_ms"] for p in per_rank]})
            if hvd.rank() == 0:
                print(f"round {r}: " + ", ".join(f"{k} {v}" if isinstance(v, str) else f"{k} {v:.1f}"
                                                 for k, v in rounds[-1].items() if k not in ("detail", "steps_ms")), flush=True)
                for rank, detail in enumerate(rounds[-1]["detail"]):
                    print(f"  rank {rank}: " + "; ".join(
                        f"{side} {d['wall_ms']:.1f} ms/step, CPU {d['cpu_ms']:.1f} (main thread {d['main_cpu_ms']:.1f}), "
                        f"gc {d['gc_ms']:.1f} ms ({d['gc_count']} pauses, {d['gc_full']} full), "
                        f"{d['faults']:.0f} page faults"
                        for side, d in detail.items()), flush=True)
    if hvd.rank() == 0:
        common.write_json(args.out, {"framework": args.framework, "world_size": hvd.size(), "samples": args.samples,
                                     "batch": BATCH, "skip_steps": SKIP_STEPS, "rounds": rounds,
                                     "horovod_env": {k: os.environ[k] for k in TUNING if k in os.environ}})


if __name__ == "__main__":
    main()
