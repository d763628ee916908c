#!/usr/bin/env bash
# Sharded optimizer state (parallel.shard_optimizer=optimizer, ZeRO-1) against data parallelism on the
# same ranks, batch and data (BENCHMARKS.md, "Sharded optimizer state"): the BERT recipe (torch, the
# default MiniLM, AdamW) on NP ranks; rounds alternate the order (A B, B A, ...); each launch appends
# one JSON line to $OUT (benchmarks/workers/stages_cost.py: per-rank parameter, gradient and optimizer
# state bytes, peak RSS, samples/s after the 3rd step).
#   nice bash benchmarks/sharded.sh runs/sharded.jsonl 2 2
set -euo pipefail
OUT=${1:-runs/sharded.jsonl}; ROUNDS=${2:-1}; NP=${3:-2}; SAMPLES=${SAMPLES:-512}
COMMON=(--recipe bert-finetune --set data.max_train_samples=$SAMPLES --set data.max_val_samples=64
        --set train.epochs=1 --set train.batch_size=16 --set train.log_every=0 --set checkpoint.enabled=false
        --set train.tensorboard=false --set train.progress_bar=false --set train.threads=1)
run() {  # LABEL OVERRIDES...
  local label=$1; shift
  rm -rf "runs/sharded-$label"
  horovodrun -np "$NP" -H "localhost:$NP" --gloo python benchmarks/workers/stages_cost.py "$OUT" "$label-np$NP" \
    "${COMMON[@]}" --set output="runs/sharded-$label" "$@"
}
for round in $(seq "$ROUNDS"); do
  if (( round % 2 )); then run dp; run sharded --set parallel.shard_optimizer=optimizer
  else run sharded --set parallel.shard_optimizer=optimizer; run dp; fi
done
