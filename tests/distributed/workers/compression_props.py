"""Worker for tests/distributed/test_compression.py: exact properties of PowerSGD and top-k on
seeded gradients under real Horovod collectives, for one framework. Writes rank 0's applied
updates (PyTorch's logical layout) for the cross-framework comparison.

    horovodrun -np 2 -H localhost:2 --gloo python compression_props.py torch|tensorflow OUT.npz
"""

import sys

import numpy as np

from hvdtrain.core.compression import CommPlan

SHAPES = [(16, 8, 3, 3), (24, 40), (24,), (6, 5)]  # logical layout (out, in, k...)
STEPS = 4
CASES = {  # name: (plan, per-step tolerance against the plain average or None)
    "powersgd_r2": (CommPlan("powersgd", powersgd_rank=2, powersgd_min_size=0), None),
    "powersgd_full": (CommPlan("powersgd", powersgd_rank=4096, powersgd_min_size=0), 1e-5),
    "powersgd_warmup": (CommPlan("powersgd", powersgd_rank=1, powersgd_min_size=0, powersgd_start_step=STEPS), 1e-6),
    "powersgd_fp16": (CommPlan("powersgd", powersgd_rank=2, powersgd_min_size=100, fp16_wire=True), None),
    "topk_10pct": (CommPlan("topk", topk_ratio=0.1), None),
    "topk_all": (CommPlan("topk", topk_ratio=1.0), 1e-6),
    "topk_fp16": (CommPlan("topk", topk_ratio=0.05, fp16_wire=True), None),
}


def gradients(step, rank):
    rng = np.random.default_rng([7, step, rank])
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


class TorchBackend:
    def __init__(self):
        import horovod.torch as hvd
        import torch

        from hvdtrain.torch import compression

        hvd.init()
        self.hvd, self.torch, self.mod = hvd, torch, compression

    def exchange(self, plan):
        return (self.mod.PowerSGD if plan.method == "powersgd" else self.mod.TopK)(plan)

    def reduce(self, ex, grads):
        return [t.numpy() for t in ex.reduce([self.torch.from_numpy(g) for g in grads])]

    def residuals(self, ex):
        return [ex.error[i].reshape(s).numpy() if i in ex.error else np.zeros(s, np.float32)
                for i, s in enumerate(SHAPES)]

    def mean_over_ranks(self, arrays):
        return [self.hvd.allreduce(self.torch.from_numpy(a), op=self.hvd.Average, name=f"check.{i}").numpy()
                for i, a in enumerate(arrays)]


class TensorFlowBackend:
    def __init__(self):
        import horovod.tensorflow as hvd
        import tensorflow as tf

        from hvdtrain.tensorflow import compression

        hvd.init()
        self.hvd, self.tf, self.mod = hvd, tf, compression
        self.perms = [compression.logical_perm(len(s)) for s in SHAPES]
        self.tf_shapes = [tuple(np.array(s)[np.argsort(p)]) for s, p in zip(SHAPES, self.perms)]

    def exchange(self, plan):
        return (self.mod.PowerSGD if plan.method == "powersgd" else self.mod.TopK)(plan, self.tf_shapes)

    def reduce(self, ex, grads):
        tf_grads = [self.tf.constant(g.transpose(np.argsort(p))) for g, p in zip(grads, self.perms)]
        return [np.asarray(t).transpose(p) for t, p in zip(ex.reduce(tf_grads), self.perms)]

    def residuals(self, ex):
        out = []
        for i, (s, p, ts) in enumerate(zip(SHAPES, self.perms, self.tf_shapes)):
            if i not in ex.errors:
                out.append(np.zeros(s, np.float32))
            elif ex.plan.method == "topk":
                out.append(ex.errors[i].numpy().reshape(ts).transpose(p))
            else:
                out.append(ex.errors[i].numpy().reshape(s))
        return out

    def mean_over_ranks(self, arrays):
        return [self.hvd.allreduce(self.tf.constant(a), op=self.hvd.Average, name=f"check.{i}").numpy()
                for i, a in enumerate(arrays)]


def main():
    framework, out = sys.argv[1], sys.argv[2]
    backend = TorchBackend() if framework == "torch" else TensorFlowBackend()
    rank, size = backend.hvd.rank(), backend.hvd.size()
    saved = {}
    for name, (plan, tolerance) in CASES.items():
        ex = backend.exchange(plan)
        applied_sum = [np.zeros(s, np.float64) for s in SHAPES]
        true_sum = [np.zeros(s, np.float64) for s in SHAPES]
        for step in range(STEPS):
            mean = [np.mean([gradients(step, r)[i] for r in range(size)], axis=0, dtype=np.float64)
                    for i in range(len(SHAPES))]
            applied = backend.reduce(ex, gradients(step, rank))
            for i, a in enumerate(applied):
                assert a.shape == SHAPES[i], (name, a.shape, SHAPES[i])
                applied_sum[i] += a
                true_sum[i] += mean[i]
                saved[f"{name}/{step}/{i}"] = a
                if tolerance is not None:
                    error = float(np.max(np.abs(a - mean[i])))
                    assert error <= tolerance, f"{name} step {step} tensor {i}: {error} > {tolerance}"
            gathered = backend.mean_over_ranks([a.astype(np.float32) for a in applied])
            for a, g in zip(applied, gathered):  # every rank applies the same update
                assert np.array_equal(a, g), f"{name}: ranks applied different updates"
        # error feedback: applied + mean residual == sum of the true mean gradients
        residual = backend.mean_over_ranks(backend.residuals(ex))
        for i in range(len(SHAPES)):
            gap = float(np.max(np.abs(applied_sum[i] + residual[i] - true_sum[i])))
            limit = 2e-2 if plan.fp16_wire else 1e-4
            assert gap <= limit, f"{name} tensor {i}: applied + residual misses the true sum by {gap}"
        if plan.method == "powersgd" and plan.powersgd_rank < 4 and tolerance is None:
            lowrank = float(np.max(np.abs(applied[1] - mean[1])))
            assert lowrank > 1e-3, f"{name}: a rank-{plan.powersgd_rank} update equals the average ({lowrank})"
    if rank == 0:
        np.savez(out, **saved)
        print(f"compression properties hold ({framework}, {len(CASES)} cases, {size} ranks)")


if __name__ == "__main__":
    main()
