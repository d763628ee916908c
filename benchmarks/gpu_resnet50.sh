#!/usr/bin/env bash
# GPU benchmark: ResNet-50 with mixed precision at np=1 on one GPU, next to Horovod's own synthetic
# benchmark on the same machine. Never part of CI.
#
#   bash benchmarks/gpu_resnet50.sh SDIST_DIR [OUT_DIR]
#
# SDIST_DIR holds horovod-0.28.1.tar.gz (and, if this machine lacks them, wheels of Horovod's build
# and run dependencies: cloudpickle psutil pyyaml packaging cffi setuptools wheel, and hvdtrain's:
# click pyyaml pillow). No internet is needed. Assumed present: python3 with a CUDA build of torch,
# the nvidia-nccl-cu13 wheel (NCCL headers and library), cmake, g++, and nvcc (found on PATH, in
# $HOROVOD_CUDA_HOME/bin, /usr/local/cuda/bin or a pip nvidia-cuda-nvcc wheel).
#
# Steps: (1) build Horovod 0.28.1 from the sdist with NCCL, for PyTorch only, into a venv that sees the
# system torch (--system-site-packages), kernels for this GPU's compute capability only; (2) Horovod's
# synthetic benchmark (benchmarks/horovod_torch_loop.py --synthetic: the loop of Horovod's
# pytorch_synthetic_benchmark.py, same ResNet-50 as torchvision's v1.5, 25.6M parameters), fp32 as
# Horovod publishes it and with AMP; (3) `hvdtrain bench` (the same synthetic batch through
# hvdtrain's adapter) with train.mixed_precision=fp16; (4) the image-classification recipe with
# resnet50, 224x224, fp16 mixed precision on a generated ImageFolder of RGB JPEGs (the real input
# pipeline: Pillow decode in hvdtrain's prefetch thread). Everything lands in OUT_DIR
# (default benchmarks/gpu-results): summary.md, one JSON per run, the logs, nvidia-smi.
# NVIDIA's published ResNet-50 figures for the GPU named in summary.md are to be cited next to these
# (NVIDIA Deep Learning Examples, ResNet-50 v1.5 for PyTorch, performance tables); this script cannot
# download them.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sdist_dir="$(cd "${1:?usage: bash benchmarks/gpu_resnet50.sh SDIST_DIR [OUT_DIR]}" && pwd)"
out="$(mkdir -p "${2:-$repo/benchmarks/gpu-results}" && cd "${2:-$repo/benchmarks/gpu-results}" && pwd)"
python="${PYTHON:-python3}"
work="${HVDTRAIN_GPU_WORK:-/tmp/hvdtrain-gpu}"
batch="${BATCH:-256}"
say() { printf '[gpu_resnet50] %s\n' "$*" | tee -a "$out/run.log"; }
die() { printf '[gpu_resnet50] ERROR: %s\n' "$*" | tee -a "$out/run.log" >&2; exit 1; }
: > "$out/run.log"

sdist="$(ls "$sdist_dir"/horovod-0.28.1.tar.gz 2>/dev/null || true)"
[[ -f "$sdist" ]] || die "no horovod-0.28.1.tar.gz in $sdist_dir"

# --- 1. the machine --------------------------------------------------------------------------
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || die "nvidia-smi failed: no GPU driver?"
read -r gpu_name capability torch_version cuda_version < <("$python" - <<'PY'
import torch
assert torch.cuda.is_available(), "torch cannot see a GPU"
major, minor = torch.cuda.get_device_capability(0)
print(torch.cuda.get_device_name(0).replace(" ", "_"), f"{major}{minor}", torch.__version__, torch.version.cuda)
PY
) || die "$python has no CUDA build of torch that sees a GPU"
say "GPU ${gpu_name//_/ } (sm_$capability), torch $torch_version, CUDA $cuda_version"

# The nvidia-nccl-cu13 wheel: nccl.h and libnccl.so.2 somewhere under site-packages/nvidia/.
read -r nccl_include nccl_so < <("$python" - <<'PY'
import glob, os, site, sys
roots = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
headers = [h for r in roots for h in glob.glob(os.path.join(r, "nvidia", "**", "nccl.h"), recursive=True)]
libs = [l for r in roots for l in glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so*"), recursive=True)]
if not headers or not libs:
    sys.exit(1)
print(os.path.dirname(headers[0]), sorted(libs)[0])
PY
) || die "NCCL from the nvidia-nccl-cu13 wheel not found under $python's site-packages (pip install nvidia-nccl-cu13)"
nccl_lib="$work/nccl-lib"  # the wheel ships libnccl.so.2 only; CMake looks for libnccl.so
mkdir -p "$nccl_lib"
ln -sf "$nccl_so" "$nccl_lib/libnccl.so"
ln -sf "$nccl_so" "$nccl_lib/$(basename "$nccl_so")"

nvcc=""
for candidate in "$(command -v nvcc || true)" "${HOROVOD_CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc \
    $("$python" -c 'import glob, site; print(" ".join(glob.glob(site.getsitepackages()[0] + "/nvidia/*/bin/nvcc")))'); do
  [[ -x "$candidate" ]] && { nvcc="$candidate"; break; }
done
[[ -n "$nvcc" ]] || die "nvcc not found (Horovod's CUDA kernels need it): put it on PATH or set HOROVOD_CUDA_HOME"
export HOROVOD_CUDA_HOME="$(dirname "$(dirname "$nvcc")")" PATH="$(dirname "$nvcc"):$PATH"
say "nvcc: $nvcc ($("$nvcc" --version | tail -1)); NCCL: $nccl_include, $nccl_so"

# --- 2. build Horovod with NCCL, torch only ----------------------------------------------------
venv="$work/venv"
if [[ ! -x "$venv/bin/python" ]]; then
  # $python may itself be a virtual environment (the GPU image's python3 is /opt/torch/.venv/bin/python3).
  # A venv made from a venv gets the *base* interpreter's site-packages, not torch's, and that base may
  # lack ensurepip. So: no pip of its own (python -m pip comes from $python's site-packages), and a .pth
  # that adds $python's site-packages with site.addsitedir, which also runs their .pth files (setuptools'
  # distutils shim: Horovod's torch CMake imports distutils, gone from Python >= 3.12).
  "$python" -m venv --without-pip --system-site-packages "$venv" || die "could not create $venv"
  venv_site="$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  "$python" -c 'import site; print("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in site.getsitepackages()))' \
    > "$venv_site/_hvdtrain_parent_site.pth"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
for requirement in cloudpickle:cloudpickle psutil:psutil pyyaml:yaml packaging:packaging cffi:cffi click:click \
    pillow:PIL setuptools:setuptools wheel:wheel; do
  "$venv/bin/python" -c "import ${requirement#*:}" 2>/dev/null && continue
  "${pip[@]}" install -q --no-index --find-links "$sdist_dir" "${requirement%%:*}" \
    || die "${requirement%%:*} is missing; put its wheel into $sdist_dir"
done
if ! "$venv/bin/python" -c "import horovod.torch as h; assert h.nccl_built()" 2>/dev/null; then
  say "building Horovod 0.28.1 with NCCL for sm_$capability (log: $out/horovod-build.log)"
  rm -rf "$work/src" && mkdir -p "$work/src" && tar -xzf "$sdist" -C "$work/src"
  src="$work/src/horovod-0.28.1"
  # CUDA >= 13 compiles C++17 and later only; Horovod 0.28.1 asks nvcc for C++11.
  sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_INCLUDE="$nccl_include" \
  HOROVOD_NCCL_LIB="$nccl_lib" HOROVOD_NCCL_LINK=SHARED HOROVOD_BUILD_CUDA_CC_LIST="$capability" \
  CXX="$repo/scripts/cxx17-wrapper.sh" HVDTRAIN_REAL_CXX="${CXX_REAL:-g++}" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
  MAKEFLAGS="-j$(nproc)" "${pip[@]}" install -v --no-cache-dir --no-build-isolation --no-deps --no-index "$src" \
    > "$out/horovod-build.log" 2>&1 || { tail -n 40 "$out/horovod-build.log"; die "Horovod build failed"; }
fi
export LD_LIBRARY_PATH="$nccl_lib:${LD_LIBRARY_PATH:-}"
"$venv/bin/python" -c "import horovod.torch as h; assert h.nccl_built(), 'Horovod built without NCCL'; print('horovod', h.__version__, 'nccl', h.nccl_built())" \
  | tee -a "$out/run.log"
export PYTHONPATH="$repo:$repo/benchmarks:${PYTHONPATH:-}"  # hvdtrain from this checkout, not installed
"$venv/bin/python" -c "import hvdtrain.cli" || die "hvdtrain does not import in $venv (missing dependency above)"
hvdtrain=("$venv/bin/python" -c "from hvdtrain.cli import main; main()")

# --- 3. the runs (np=1, one GPU) ----------------------------------------------------------------
synthetic=(--synthetic --model resnet50 --image-size 224 --channels 3 --batch-size "$batch" --warmup 10 --steps 10 --iters 10)
say "Horovod synthetic benchmark, fp32 (as Horovod publishes it), batch $batch"
"$venv/bin/python" "$repo/benchmarks/horovod_torch_loop.py" "${synthetic[@]}" --json "$out/horovod_synthetic_fp32.json" \
  2>&1 | tee -a "$out/run.log"
say "Horovod synthetic benchmark, AMP fp16, batch $batch"
"$venv/bin/python" "$repo/benchmarks/horovod_torch_loop.py" "${synthetic[@]}" --amp --json "$out/horovod_synthetic_amp.json" \
  2>&1 | tee -a "$out/run.log"
say "hvdtrain bench, resnet50, fp16 mixed precision, batch $batch"
"${hvdtrain[@]}" bench --model resnet50 --batch-size "$batch" --set train.mixed_precision=fp16 \
  --json "$out/hvdtrain_bench_amp.json" 2>&1 | tee -a "$out/run.log"

data="$work/jpeg-imagefolder"
if [[ ! -f "$data/.complete" ]]; then
  say "writing a 224x224 RGB JPEG ImageFolder (10 classes) to $data"
  "$venv/bin/python" - "$data" "$batch" <<'PY'
import sys, pathlib, numpy as np
from PIL import Image
root, batch = pathlib.Path(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
for split, n in (("train", 12 * batch), ("val", 2 * batch)):
    for i in range(n):
        folder = root / split / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)  # smooth-ish content, JPEG-sized like photos
        Image.fromarray(base).resize((224, 224), Image.BILINEAR).save(folder / f"{i:06d}.jpg", quality=90)
(root / ".complete").write_text("ok\n")
PY
fi
say "image-classification recipe, resnet50, 224x224, fp16 mixed precision, batch $batch, np=1"
rm -rf "$work/recipe-run"
"${hvdtrain[@]}" recipe image-classification --data "$data" --model resnet50 --batch-size "$batch" --epochs 2 \
  --output "$work/recipe-run" --set data.image_size=224 --set train.mixed_precision=fp16 \
  --set checkpoint.enabled=false --set train.log_every=0 --set train.progress_bar=false \
  --set train.tensorboard=false 2>&1 | tee -a "$out/run.log"
cp "$work/recipe-run/metrics.jsonl" "$out/recipe_metrics.jsonl"

# --- 4. summary ---------------------------------------------------------------------------------
"$venv/bin/python" - "$out" "${gpu_name//_/ }" "$torch_version" "$cuda_version" "$batch" <<'PY' | tee "$out/summary.md"
import json, sys, pathlib
out, gpu, torch_v, cuda_v, batch = pathlib.Path(sys.argv[1]), *sys.argv[2:]
load = lambda name: json.loads((out / name).read_text())
fp32, amp, bench = load("horovod_synthetic_fp32.json"), load("horovod_synthetic_amp.json"), load("hvdtrain_bench_amp.json")
recipe = [json.loads(l) for l in (out / "recipe_metrics.jsonl").read_text().splitlines() if l.strip()][-1]
print(f"# ResNet-50 on one {gpu} (np=1), batch {batch}, torch {torch_v}, CUDA {cuda_v}\n")
print("| run | images/s | vs Horovod synthetic (AMP) |\n|---|---|---|")
rows = [("Horovod synthetic benchmark, fp32", fp32["per_worker"]),
        ("Horovod synthetic benchmark, AMP fp16", amp["per_worker"]),
        ("hvdtrain bench, mixed precision fp16", bench["per_worker"]["mean"]),
        ("hvdtrain recipe image-classification, fp16, JPEG input pipeline (epoch 2)", recipe["samples_per_sec"])]
for name, value in rows:
    print(f"| {name} | {value:,.0f} | {value / amp['per_worker']:.3f} |")
print("\nNVIDIA's published ResNet-50 v1.5 training throughput for this GPU: cite it here "
      "(NVIDIA Deep Learning Examples, PyTorch ResNet-50 v1.5 performance tables).")
PY
say "done: $out/summary.md"
