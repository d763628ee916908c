"""What ZeRO-2's collective costs against data parallelism's in TensorFlow on Horovod (issue 26):
the same flat float32 gradient (``--mib``, MiniLM's is 86.6 MiB) in buckets of ``--bucket``
elements (the sharded optimizer's :data:`~hvdtrain.tensorflow.sharded.BUCKET_ELEMENTS`), averaged
with ``hvd.allreduce`` (data parallelism, ZeRO-1) or ``hvd.reducescatter`` (ZeRO-2), inside a
``tf.function`` as the adapter's step runs them; rounds alternate the order. Rank 0 prints one JSON
line per round and kind: wall seconds and this process's CPU-seconds (user + system) per exchange::

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/reducescatter_cost_tf.py --rounds 3
"""

import argparse
import json
import time

from common import cpu_seconds



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=86.6)
    parser.add_argument("--bucket", type=int, default=1 << 22)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="exchanges per round and kind")
    args = parser.parse_args()
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    size = hvd.size()
    total = int(args.mib * 2**20 / 4)
    widths = [min(args.bucket, total - start) for start in range(0, total, args.bucket)]
    widths = [-(-w // size) * size for w in widths]  # each bucket padded to the world size
    buckets = [tf.random.stateless_uniform([w], seed=[hvd.rank(), i]) for i, w in enumerate(widths)]

    def exchange(kind):
        out = []
        for i, b in enumerate(buckets):
            if kind == "reducescatter":
                out.append(hvd.reducescatter(b, op=hvd.Average, name=f"rs.{i}"))
            else:
                out.append(hvd.allreduce(b, op=hvd.Average, name=f"ar.{i}")[:b.shape[0] // size])
        return tf.add_n([tf.reduce_sum(o) for o in out])

    steps = {kind: tf.function(lambda kind=kind: exchange(kind), autograph=False)
             for kind in ("allreduce", "reducescatter")}
    for kind in steps:
        steps[kind]().numpy()  # trace and warm up
    for round_ in range(args.rounds):
        for kind in ("allreduce", "reducescatter") if round_ % 2 == 0 else ("reducescatter", "allreduce"):
            hvd.allreduce(tf.constant(0.0), name=f"barrier.{round_}.{kind}")
            wall, cpu = time.perf_counter(), cpu_seconds()
            for _ in range(args.repeats):
                steps[kind]().numpy()
            wall, cpu = (time.perf_counter() - wall) / args.repeats, (cpu_seconds() - cpu) / args.repeats
            if hvd.rank() == 0:
                print(json.dumps({"round": round_ + 1, "kind": kind, "ranks": size, "mib": args.mib,
                                  "buckets": len(buckets), "wall_sec": round(wall, 4), "cpu_sec": round(cpu, 4)}),
                      flush=True)


if __name__ == "__main__":
    main()
