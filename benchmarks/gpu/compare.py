"""Compare the final weights (and metrics) of two runs of the image recipe.

    python benchmarks/gpu/compare.py RUN_A RUN_B exact      # bitwise: every tensor equal
    python benchmarks/gpu/compare.py RUN_A RUN_B 1e-4       # every tensor within that relative error

Reads each run's last epoch checkpoint (``checkpoints/epoch-*/model.pt``, and ``grad_scaler.pt`` under
fp16: GradScaler's scale and growth tracker must be equal too) and ``metrics.jsonl``;
exits 1 when they differ beyond what was asked, 2 when a run has no checkpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def final(run: Path) -> Path:
    epochs = sorted((run / "checkpoints").glob("epoch-*"))
    if not epochs:
        print(f"{run}: no epoch checkpoint")
        raise SystemExit(2)
    return epochs[-1]


def last_metrics(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {k: rows[-1].get(k) for k in ("epoch", "train_loss", "val_loss", "val_accuracy", "skipped_updates")}


def main() -> None:
    a, b, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    fa, fb = final(a), final(b)
    wa = torch.load(fa / "model.pt", map_location="cpu", weights_only=True)
    wb = torch.load(fb / "model.pt", map_location="cpu", weights_only=True)
    assert wa.keys() == wb.keys(), "the two runs saved different tensors"
    worst, unequal = 0.0, 0
    for name in wa:
        x, y = wa[name], wb[name]
        if not torch.equal(x, y):
            unequal += 1
            if x.is_floating_point():
                worst = max(worst, float((x.double() - y.double()).norm() / x.double().norm().clamp_min(1e-30)))
            else:
                worst = float("inf")
    print(f"{fa} vs {fb}: {len(wa)} tensors, {unequal} not bitwise equal, worst relative error {worst:.3g}")
    scales = [torch.load(f / "grad_scaler.pt", weights_only=True) if (f / "grad_scaler.pt").exists() else None for f in (fa, fb)]
    if scales[0] is not None or scales[1] is not None:  # fp16: GradScaler's state as each run saved it
        print("GradScaler A:", scales[0], "B:", scales[1])
        unequal += int(scales[0] != scales[1])
    print("metrics A:", last_metrics(a))
    print("metrics B:", last_metrics(b))
    ok = unequal == 0 if mode == "exact" else worst <= float(mode)
    print("PASS" if ok else "FAIL", f"({mode})")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
