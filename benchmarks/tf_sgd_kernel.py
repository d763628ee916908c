"""hvdtrain's TensorFlow SGD update (torch's momentum rule through TensorFlow's fused ApplyMomentum
kernel) against the same rule as separate operations (what it ran before 2026-11-28), on the
gradients of the benchmarks' model (small_cnn on MNIST: 1.6M weights), one thread, interleaved;
half the calls after a pass over 128 MiB that evicts the caches, as between two training steps.

    python benchmarks/tf_sgd_kernel.py --calls 300
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tensorflow as tf

from hvdtrain.tensorflow.optimizers import CoupledSGD

SHAPES = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (12544, 128), (128,), (128, 10), (10,)]


class SeparateOperations(CoupledSGD):
    """The same rule as four operations per variable, each through a temporary."""

    def update_step(self, gradient, variable, learning_rate):
        velocity = self.momentums[self._get_variable_index(variable)]
        self.assign(velocity, velocity * tf.cast(self.momentum, variable.dtype) + tf.cast(gradient, variable.dtype))
        self.assign_sub(variable, velocity * tf.cast(learning_rate, variable.dtype))


def updater(cls, weights):
    """A traced update of fresh variables by an optimizer of class ``cls``."""
    variables = [tf.Variable(w) for w in weights]
    optimizer = cls(learning_rate=0.05, momentum=0.9)
    optimizer.build(variables)
    return tf.function(lambda grads: optimizer.apply_gradients(zip(grads, variables))), variables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
    sides = {"fused kernel": updater(CoupledSGD, weights), "separate operations": updater(SeparateOperations, weights)}
    evict = [tf.constant(rng.standard_normal(8 << 20).astype(np.float32)) for _ in range(4)]
    touch = tf.function(lambda tensors: tf.add_n([tf.reduce_sum(t) for t in tensors]))
    times = {name: ([], []) for name in sides}  # (caches warm, after the eviction pass)
    for i in range(args.calls):
        order = list(sides) if i % 2 else list(sides)[::-1]
        for name in order:
            cold = i % 4 < 2
            if cold:
                touch(evict)
            started = time.perf_counter()
            sides[name][0](grads)
            times[name][cold].append(time.perf_counter() - started)
    same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(*(v for _, v in sides.values())))
    for name, (warm, cold) in times.items():
        print(f"{name}: {1000 * np.median(warm):.2f} ms per update warm, {1000 * np.median(cold):.2f} ms after eviction")
    fused, separate = (times[name] for name in sides)
    print(f"fused / separate: warm {np.median(fused[0]) / np.median(separate[0]):.3f}, "
          f"after eviction {np.median(fused[1]) / np.median(separate[1]):.3f}; same weights after "
          f"{args.calls} updates each: {same}")


if __name__ == "__main__":
    main()
