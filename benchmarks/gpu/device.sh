#!/usr/bin/env bash
# Everything hvdtrain measures and checks on one lent GPU, in one prepared call.
#
#   bash benchmarks/gpu/device.sh [OUT_DIR] [SECTIONS]     # from the repository root, on the GPU machine
#
# Needs there: python3 with a CUDA build of torch (2.11.0+cu130 on the lent H100/H200), the
# nvidia-nccl-cu13 wheel, transformers, scikit-image (its photos make the JPEG tree); and, carried
# in .gpu/ (`make gpu-wheel` fills it on any CPU machine): Horovod built with NCCL for that stack
# and the wheels hvdtrain needs that the machine lacks. SECTIONS (default: all, in this order) picks
# some of: build steps bert jpeg fp16 checks compile. Order: the speed measurements alone on the GPU
# (steps, bert, jpeg, fp16), then the correctness checks (checks: small real jobs under horovodrun
# -np 1, their chains side by side: kill-and-resume, fp16/bf16, sharded optimizer state, compression,
# compiled steps, device choice), then the compiled-step timings (compile: slow to compile, so last).
# Each section has its own time limit and writes its results under OUT_DIR as it goes, so a call that
# runs out of time still returns what finished; summary.txt lists each section's outcome and seconds.
# Without a GPU (CPU rehearsal: HVDTRAIN_GPU_REHEARSAL=1) every size is tiny.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
results="$(mkdir -p "${1:-${OUT:-/tmp/hvdtrain-gpu-out}}" && cd "${1:-${OUT:-/tmp/hvdtrain-gpu-out}}" && pwd)"
sections="${2:-build steps bert jpeg fp16 checks compile}"
python="${PYTHON:-python3}"
work="${HVDTRAIN_GPU_WORK:-/tmp/hvdtrain-gpu}"
small="${HVDTRAIN_GPU_REHEARSAL:-0}"
out="$work/out"  # every log and JSON; RESULTS gets summary.txt and all of them as logs.tgz after each step
mkdir -p "$work" "$out"
cd "$repo"
summary="$results/summary.txt"
say() { printf '[device %s] %s\n' "$(date +%T)" "$*" | tee -a "$out/log.txt"; }

# --- the carried wheels: installed into a folder of their own, never into the machine's Python ---
site="$work/site"
if [[ -d .gpu ]] && compgen -G ".gpu/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu/*.whl \
    > "$out/pip.txt" 2>&1 || { cat "$out/pip.txt"; say "installing the carried wheels failed"; }
fi
export PYTHONPATH="$repo:$repo/benchmarks:$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH" PYTHONUNBUFFERED=1
nccl_lib="$("$python" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)"
export LD_LIBRARY_PATH="${nccl_lib:+$nccl_lib:}${LD_LIBRARY_PATH:-}"
export HVDTRAIN_DATA_CACHE="$work/cache" TF_CPP_MIN_LOG_LEVEL=2 HOROVOD_LOG_LEVEL=warning
hvdtrain=("$python" -m hvdtrain.cli)

# run NAME SECONDS CMD...: one measurement with its own limit; its output in OUT/NAME.log
run() {
  local name="$1" limit="$2"; shift 2
  local started=$SECONDS rc
  say "$name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  printf '%-28s rc=%-4s %5ss\n' "$name" "$rc" "$((SECONDS - started))" | tee -a "$summary"
  tail -n 3 "$out/$name.log" | sed 's/^/    /'
  tar czf "$results/.logs.$BASHPID.tgz" -C "$out" . 2>/dev/null && mv "$results/.logs.$BASHPID.tgz" "$results/logs.tgz"
  return $rc
}
want() { [[ " $sections " == *" $1 "* ]]; }

if [[ "$small" == 1 ]]; then
  R50=(--model resnet18 --batch 4 --size 32 --warmup 1 --steps 2 --rounds 2)
  BERT=(--model bert --batch 4 --size 8 --seq 16 --warmup 1 --steps 2 --rounds 2)
  TREE=(2 48 8); JPEG_TREE=(2 16 4); RES=16; BIG_BATCH=8; EPOCHS=2; KILL=10
else
  R50=(--model resnet50 --batch 256 --size 224 --warmup 10 --steps 20 --rounds 3)
  BERT=(--model bert --batch 64 --size 224 --seq 128 --warmup 10 --steps 20 --rounds 3)
  TREE=(8 32 16); JPEG_TREE=(8 1000 25); RES=64; BIG_BATCH=256; EPOCHS=3; KILL=14
fi

if want build; then
  run build 120 bash -c "nvidia-smi; $python -c 'import torch, horovod, horovod.torch as h; h.init(); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no GPU\"); print(\"horovod\", horovod.__version__, \"nccl_built\", h.nccl_built(), \"gloo\", h.gloo_built(), \"size\", h.size())'; horovodrun --check-build"
fi

# --- issue 44: speed, each measurement alone on the GPU ------------------------------------------
if want steps; then
  run resnet50_bf16 200 "$python" benchmarks/gpu/steps.py "${R50[@]}" --precision bf16 --profile --tag a --json "$out/resnet50_bf16.json"
fi
if want bert; then
  run bert_bf16 150 "$python" benchmarks/gpu/steps.py "${BERT[@]}" --precision bf16 --optim adamw --profile --tag c --json "$out/bert_bf16.json"
fi
if want jpeg; then
  # real photos cut into an ImageNet-like JPEG tree (one process per class), then the recipe on it
  run jpeg_tree 120 "$python" - "$work/photos" "${JPEG_TREE[@]}" <<'PY'
import sys
from multiprocessing import Pool
import photo_tree
root, classes, train, val = sys.argv[1], *map(int, sys.argv[2:])
with Pool(classes) as pool:
    pool.starmap(photo_tree.make_tree, [(root, 1, train, val, (500, 375), 90, i, (name,))
                                         for i, name in enumerate(photo_tree.PHOTOS[:classes])])
print(root)
PY
  rm -rf "$work/jpeg-run"
  run jpeg_recipe 200 "${hvdtrain[@]}" recipe image-classification --framework torch --data "$work/photos" \
    --model "$([[ $small == 1 ]] && echo resnet18 || echo resnet50)" --batch-size "$BIG_BATCH" --epochs "$EPOCHS" \
    --output "$work/jpeg-run" --set image.size="$([[ $small == 1 ]] && echo 32 || echo 224)" \
    --set train.mixed_precision=bf16 --set checkpoint.enabled=false --set train.log_every=0 --set train.tensorboard=false
  cp "$work/jpeg-run/metrics.jsonl" "$out/jpeg_metrics.jsonl" 2>/dev/null
fi
if want fp16; then
  run resnet50_fp16 150 "$python" benchmarks/gpu/steps.py "${R50[@]}" --precision fp16 --tag b --json "$out/resnet50_fp16.json"
fi

# --- issue 45: correctness, small real jobs (chains side by side: the GPU has room) ---------------
tree="$work/tree-small"
job() {  # job NAME OUTPUT [--set ...]: the recipe through horovodrun -np 1 (device choice under a launcher);
  # ResNet-18 with BatchNorm on the photo tree, AdamW, deterministic, checkpoints every 4 steps
  local name="$1" output="$2"; shift 2
  run "$name" 240 horovodrun -np 1 -H localhost:1 --gloo "${hvdtrain[@]}" recipe image-classification --framework torch \
    --data "$tree" --model resnet18 --batch-size 16 --epochs 2 --output "$output" --set image.size="$RES" \
    --set image.workers=1 --set optim.name=adamw --set optim.lr=0.001 --set train.deterministic=true \
    --set checkpoint.every_steps=4 --set train.log_every=0 --set train.tensorboard=false "$@"
}
compare() {  # compare NAME A B [exact|TOL]: final weights of two runs (waits for A's, made by another chain)
  local waited=0
  until compgen -G "$2/checkpoints/epoch-*" >/dev/null || (( waited > 90 )); do sleep 2; waited=$((waited + 2)); done
  run "$1" 60 "$python" benchmarks/gpu/compare.py "$2" "$3" "${4:-exact}"
}
killed_then_resumed() {  # NAME [--set ...]: straight run, a run killed at step $KILL (after a checkpoint), its resume
  # (FAULT=...: a fault all three runs get, e.g. a NaN loss before the kill)
  local name="$1"; shift
  rm -rf "$work/$name-a" "$work/$name-b"
  HVDTRAIN_FAULT="${FAULT:-}" job "${name}_straight" "$work/$name-a" "$@"
  HVDTRAIN_FAULT="${FAULT:+$FAULT,}kill:rank=0:step=$KILL" job "${name}_killed" "$work/$name-b" "$@"
  HVDTRAIN_FAULT="${FAULT:-}" job "${name}_resumed" "$work/$name-b" "$@" --resume
  compare "${name}_bitwise" "$work/$name-a" "$work/$name-b" exact
}
base="$work/resume_fp32-a"
if want checks || want checks_core; then
  [[ -f "$tree/.done" ]] || { "$python" -c "import photo_tree; photo_tree.make_tree('$tree', ${TREE[0]}, ${TREE[1]}, ${TREE[2]})" \
    && touch "$tree/.done"; }
  killed_then_resumed resume_fp32 &
  killed_then_resumed resume_fp16 --set train.mixed_precision=fp16 &
  (rm -rf "$work/bf16"; job bf16_learns "$work/bf16" --set train.mixed_precision=bf16
   for mode in optimizer gradients; do
     rm -rf "$work/shard-$mode"; job "shard_$mode" "$work/shard-$mode" --set parallel.shard_optimizer=$mode
     compare "shard_${mode}_vs_dp" "$base" "$work/shard-$mode" 1e-4
   done) &
  killed_then_resumed compress_powersgd --set comm.compression=powersgd &
  want checks && (for kind in topk fp16; do killed_then_resumed "compress_$kind" --set comm.compression=$kind; done) &
  # fp16: a NaN loss at step 2 makes GradScaler skip that update and halve its scale; the run killed
  # at step $KILL resumes with the scale its checkpoint kept (compare.py prints both runs' scales)
  want checks && FAULT=nan:rank=0:step=2 killed_then_resumed scaler_overflow --set train.mixed_precision=fp16 &
  want checks && (rm -rf "$work/compiled"; job compiled_default "$work/compiled" --set train.compile=default
   compare compiled_vs_eager "$base" "$work/compiled" 1e-3
   rm -rf "$work/ro"; job compiled_reduce_overhead "$work/ro" --set train.compile=reduce-overhead
   compare reduce_overhead_vs_eager "$base" "$work/ro" 1e-3
   rm -rf "$work/ro2"; job cuda_graphs_with_accumulation_refused "$work/ro2" --set train.compile=reduce-overhead \
     --set train.grad_accumulation=2) &
  run device_choice 60 bash -c "$python -c 'import torch; from hvdtrain.torch.adapter import pick_device; print(\"one visible:\", pick_device(0, 1), torch.cuda.device_count())'; CUDA_VISIBLE_DEVICES=0 $python -c 'from hvdtrain.torch.adapter import pick_device; print(\"CUDA_VISIBLE_DEVICES=0, local rank 0 of 1:\", pick_device(0, 1)); print(\"local rank 1 of 2 seeing one GPU:\", pick_device(1, 2))'"
  wait
fi

# --- issue 44: compiled steps inside hvdtrain (compiling takes a minute or more: last) --------------
if want compile; then
  run resnet50_compiled 200 "$python" benchmarks/gpu/steps.py "${R50[@]}" --precision bf16 --compile default --loops hvdtrain --tag d --json "$out/resnet50_compiled.json"
  run bert_compiled 150 "$python" benchmarks/gpu/steps.py "${BERT[@]}" --precision bf16 --optim adamw --compile default --loops hvdtrain --tag e --json "$out/bert_compiled.json"
fi
say "done"
cat "$summary"
