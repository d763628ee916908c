"""What ``hvdtrain.torch.prepare`` costs a user's own loop against the same loop written with
Horovod by hand (issue 39: at least 0.99), the two sides interleaved (A B, B A, ...) in one job.

Both sides train the image recipe's ``small_cnn`` on the same real MNIST images from the same
``DataLoader(TensorDataset, batch_size=64)``, with SGD, one epoch per round, no checkpoints:

* A, by hand (Horovod's own examples): ``hvd.DistributedOptimizer``, ``broadcast_parameters`` and
  ``broadcast_optimizer_state``, a ``DistributedSampler`` with ``set_epoch``;
* B, ``prepare(model, optimizer, loader)``: hvdtrain's default exchange (flat gradient buffers), the
  positioned loader, ``run.optimizer.step()``.

Each side's rate is taken between the end of step 4 and its last step; the ratio B/A per round and
its median are printed. Run under Horovod (both sides use the threads prepare() sets: the cores
shared among the local workers)::

    horovodrun -np 2 -H localhost:2 python benchmarks/own_loop_overhead.py [ROUNDS (default 7)] [SAMPLES (default 4096)] [OUT.json]

``benchmarks/run.py --only 1`` runs it as row 1-torch-prepare (OUT.json: the JSON line below).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BATCH, LR, MODEL, SEED, SKIP_STEPS, mnist_arrays, steady_rate  # noqa: E402

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

from hvdtrain.torch import prepare  # noqa: E402
from hvdtrain_recipes.image_classification.torch_models import build_model  # noqa: E402


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(SEED)
    model = build_model(MODEL, 1, (28, 28), 10)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def by_hand(data: TensorDataset, epoch: int) -> float:
    """Side A: one epoch of the hand-written Horovod loop; samples/s per worker of its steady steps."""
    model, optimizer = model_and_optimizer()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    ends = []
    for x, y in DataLoader(data, batch_size=BATCH, sampler=sampler):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        ends.append(time.perf_counter())
    return steady_rate(ends, BATCH, SKIP_STEPS)


def by_prepare(data: TensorDataset, epoch: int) -> float:
    """Side B: the same loop through prepare()."""
    model, optimizer = model_and_optimizer()
    run = prepare(model, optimizer, DataLoader(data, batch_size=BATCH, shuffle=True), train__seed=SEED)
    run.data.set_epoch(epoch)
    ends = []
    for x, y in run.data:
        F.cross_entropy(run.model(x), y).backward()
        run.optimizer.step()
        ends.append(time.perf_counter())
    return steady_rate(ends, BATCH, SKIP_STEPS)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    samples = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    x, y, _, _ = mnist_arrays(samples)
    data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    started = time.time()
    by_prepare(data, 0)  # warm-up (Horovod started here, threads set) ...
    by_hand(data, 0)  # ... and the other side's first allocations
    hand, own, ratios = [], [], []
    for k in range(rounds):
        order = (("hand", by_hand), ("prepare", by_prepare))
        got = {name: side(data, k + 1) for name, side in (order if k % 2 == 0 else order[::-1])}
        hand.append(got["hand"])
        own.append(got["prepare"])
        ratios.append(got["prepare"] / got["hand"])
        if hvd.rank() == 0:
            print(f"round {k + 1}: by hand {got['hand']:.1f}, prepare() {got['prepare']:.1f} samples/s per worker, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    if hvd.rank() == 0:
        result = json.dumps({"workers": hvd.size(), "threads": torch.get_num_threads(), "samples": samples,
                             "hand_median": round(statistics.median(hand), 1),
                             "prepare_median": round(statistics.median(own), 1), "hand": hand, "prepare": own,
                             "ratios": [round(r, 3) for r in ratios],
                             "median_ratio": round(statistics.median(ratios), 3),
                             "minutes": round((time.time() - started) / 60, 1)})
        print(result)
        if out is not None:
            out.write_text(result)


if __name__ == "__main__":
    main()
