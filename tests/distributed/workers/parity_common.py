"""Framework-neutral parts of the parity workers: data, rank-specific steps, the report."""

import json
import sys

import numpy as np

LR, BATCH, FEATURES, CLASSES = 0.5, 4, 8, 3


def parse_args():
    """``REPORT_PATH CASE [CASE ...]`` from the command line, each case ``ACCUMULATION:{fp32,fp16}``
    (one launch runs several cases in turn, each with a fresh adapter and model)."""
    cases = []
    for case in sys.argv[2:]:
        accumulation, precision = case.split(":")
        cases.append((case, int(accumulation), precision == "fp16"))
    return sys.argv[1], cases


def case_overrides(accumulation, fp16):
    """The config keys of one case (plain SGD without momentum, so an update reads off the gradient)."""
    return [f"train.grad_accumulation={accumulation}", f"comm.compression={'fp16' if fp16 else 'none'}",
            "optim.momentum=0.0"]


def spread(vectors):
    """Largest absolute difference between any rank's vector and rank 0's."""
    return float(max(np.abs(v - vectors[0]).max() for v in vectors))


def global_batch(size, accumulation, seed=1234):
    """The batch of all ranks' micro-batches, and the generator for later data."""
    rng = np.random.default_rng(seed)
    n_all = size * accumulation * BATCH
    x_all = rng.standard_normal((n_all, FEATURES)).astype(np.float32)
    y_all = rng.integers(0, CLASSES, n_all).astype(np.int64)
    return x_all, y_all, rng


def micro_batches(rank, size, accumulation):
    """Indices into the global batch of this rank's micro-batches."""
    return np.arange(size * accumulation * BATCH).reshape(size, accumulation, BATCH)[rank]


def train_on_rank_specific_data(adapter, rng, rank, steps=5):
    """A few full steps where every rank sees different inputs."""
    for _ in range(steps):
        x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32) + rank
        y = rng.integers(0, CLASSES, BATCH).astype(np.int64)
        adapter.train_step(x, y, apply_update=True)


def report(ctx, before, after, update, expected, final):
    """What the test asserts on, for one case."""
    return {"world_size": ctx.size, "spread_before_broadcast": before, "spread_after_broadcast": after,
            "grad_max_abs_error": float(np.abs(update - expected).max()),
            "grad_max_abs": float(np.abs(expected).max()), "spread_after_steps": final}


def write_report(path, rank, reports):
    """Rank 0 writes every case's report, by case."""
    if rank == 0:
        with open(path, "w") as f:
            json.dump(reports, f)


def run_cases(out_path, cases, run_case):
    """Run each ``(name, accumulation, fp16)`` case with ``run_case`` (-> rank, report) and write
    the reports by case (rank 0)."""
    reports, rank = {}, 0
    for name, accumulation, fp16 in cases:
        rank, reports[name] = run_case(accumulation, fp16)
    write_report(out_path, rank, reports)
