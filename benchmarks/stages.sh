#!/usr/bin/env bash
# Pipeline stages against pure data parallelism on the same 4 workers and global batch (BENCHMARKS.md,
# "Pipeline stages"). Rounds alternate the configurations; each launch appends one JSON line to $OUT.
#   nice bash benchmarks/stages.sh runs/stages.jsonl 2
set -euo pipefail
OUT=${1:-runs/stages.jsonl}; ROUNDS=${2:-1}; MODEL=${MODEL:-resnet18}; SAMPLES=${SAMPLES:-1024}
COMMON=(--set model.name=$MODEL --set data.max_train_samples=$SAMPLES --set data.max_val_samples=64
        --set train.epochs=1 --set train.log_every=0 --set checkpoint.enabled=false --set train.tensorboard=false
        --set train.progress_bar=false --set train.threads=1)
run() {  # LABEL OVERRIDES...
  local label=$1; shift
  rm -rf "runs/stages-$label"
  horovodrun -np 4 -H localhost:4 --gloo python benchmarks/workers/stages_cost.py "$OUT" "$label" \
    "${COMMON[@]}" --set output="runs/stages-$label" "$@"
}
for round in $(seq "$ROUNDS"); do
  run dp --set train.batch_size=16
  for m in 1 4 8; do
    run "s2-m$m" --set train.batch_size=32 --set parallel.pipeline_stages=2 --set parallel.micro_batches=$m \
      --set comm.timeline="runs/stages-timeline-m$m.json"
  done
done
