#!/usr/bin/env bash
# `make demo`: the image-classification recipe on NP ranks for both frameworks on the embedded
# MNIST (60,000 training images, accuracy measured on the full 10,000-image test set).
#   bash scripts/demo.sh [NP] [OUTPUT_ROOT]
set -euo pipefail
np="${1:-2}"
out="${2:-runs/demo}"
for framework in torch tensorflow; do
  rm -rf "$out/$framework"
  start=$(date +%s)
  horovodrun -np "$np" -H "localhost:$np" --gloo \
    hvdtrain recipe image-classification --framework "$framework" --output "$out/$framework"
  echo "demo: $framework finished in $(( $(date +%s) - start )) s"
done
python - "$out" <<'PY'
import json, sys, pathlib
root = pathlib.Path(sys.argv[1])
for fw in ("torch", "tensorflow"):
    rows = [json.loads(l) for l in (root / fw / "metrics.jsonl").read_text().splitlines() if l.strip()]
    last = rows[-1]
    print(f"demo result: {fw:10s} val_accuracy={last['val_accuracy']:.4f} on 10000 MNIST test images "
          f"(epochs={last['epoch']}, world_size={last['world_size']}, {last['samples_per_sec']:.0f} samples/s)")
PY
