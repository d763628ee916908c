#!/usr/bin/env bash
# Sharded optimizer state (parallel.shard_optimizer=optimizer, ZeRO-1) against data parallelism on the
# same ranks, batch and data (BENCHMARKS.md, "Sharded optimizer state"): the BERT recipe (torch, the
# default MiniLM, AdamW) on NP ranks; rounds alternate the order (A B, B A, ...); each launch appends
# one JSON line to $OUT (benchmarks/workers/stages_cost.py: per-rank parameter, gradient and optimizer
# state bytes, peak RSS, samples/s after the 3rd step).
#   nice bash benchmarks/sharded.sh runs/sharded.jsonl 2 2
# TensorFlow (FRAMEWORK=tensorflow): benchmarks/sharded_memory_tf.py runs none, optimizer and gradients
# (ZeRO-2) interleaved, batch 8 x 64 tokens per rank, and appends per-rank bytes, peak RSS, samples/s
# and CPU-seconds per step after the 3rd step; its `summary` prints the per-round ratios:
#   FRAMEWORK=tensorflow SAMPLES=256 nice bash benchmarks/sharded.sh runs/sharded_tf_rate.jsonl 3 2
# Learning (LEARN=1, either framework): the BERT recipe's defaults (125 AdamW updates) with
# parallel.shard_optimizer=gradients on NP ranks, one run per seed in $SEEDS, into runs/learn-zero2-F-sS:
#   LEARN=1 FRAMEWORK=tensorflow SEEDS="0 1 2" nice bash benchmarks/sharded.sh
set -euo pipefail
OUT=${1:-runs/sharded.jsonl}; ROUNDS=${2:-1}; NP=${3:-2}; SAMPLES=${SAMPLES:-512}
FRAMEWORK=${FRAMEWORK:-torch}
if [[ -n ${LEARN:-} ]]; then
  for seed in ${SEEDS:-0}; do
    horovodrun -np "$NP" -H "localhost:$NP" --gloo hvdtrain recipe bert-finetune --framework "$FRAMEWORK" \
      --set parallel.shard_optimizer=gradients --set train.seed="$seed" --output "runs/learn-zero2-$FRAMEWORK-s$seed"
  done
  exit 0
fi
if [[ $FRAMEWORK == tensorflow ]]; then
  python benchmarks/sharded_memory_tf.py measure "$OUT" --np "$NP" --rounds "$ROUNDS" --samples "$SAMPLES"
  exec python benchmarks/sharded_memory_tf.py summary "$OUT"
fi
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
