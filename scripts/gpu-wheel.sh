#!/usr/bin/env bash
# Build Horovod 0.28.1 with NCCL for a GPU machine's exact stack, on a CPU machine.
#
#   bash scripts/gpu-wheel.sh [OUT_DIR]        # or: make gpu-wheel
#
# The GPU machines this project is lent have no network and no Horovod, so the wheel is built here
# and carried there. This machine needs the CUDA toolkit's nvcc (CUDA_HOME, default /usr/local/cuda)
# and PyPI; it needs no GPU. The build venv holds the GPU machine's CUDA build of torch and the NCCL
# wheel that torch pins, so Horovod compiles against the same torch headers and the same nccl.h the
# job will load there. The wheel lands in OUT_DIR (default .gpu/, git-ignored) and in a cache keyed
# by everything it was built against; a second run with nothing changed only copies it.
#
# Environment (defaults: the lent GPU machine, Python 3.12 with torch 2.11.0+cu130 on an H100/H200):
#   HVDTRAIN_GPU_PYTHON   interpreter of the GPU machine's minor version (default: pyenv's 3.12)
#   HVDTRAIN_GPU_TORCH    torch requirement, the GPU machine's version   (default: torch==2.11.0)
#   HVDTRAIN_GPU_CC       GPU architectures of Horovod's kernels         (default: 90, Hopper)
#   HVDTRAIN_CACHE        build venv and wheel cache                     (default: ~/.cache/hvdtrain)
#   CUDA_HOME             CUDA toolkit with nvcc, same major as torch's  (default: /usr/local/cuda)
#
# What is built: PyTorch + Gloo + NCCL (HOROVOD_GPU_OPERATIONS=NCCL, NCCL linked as a shared
# library, so the libnccl.so.2 torch loads is the one Horovod uses); no TensorFlow (its CUDA build
# targets CUDA 12), no MPI (the GPU machine has no Open MPI for mpirun). The C++ workarounds are
# install.sh's (scripts/cxx17-wrapper.sh), except that nvcc's host compilations use plain g++.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo/.gpu}"
cache="${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}"
torch_spec="${HVDTRAIN_GPU_TORCH:-torch==2.11.0}"
cc_list="${HVDTRAIN_GPU_CC:-90}"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
HOROVOD_SPEC="horovod==0.28.1"
BUILD_SPECS=(cmake==3.31.6 cloudpickle psutil pyyaml packaging cffi "setuptools<81" wheel numpy)

say() { printf '[gpu-wheel] %s\n' "$*"; }
die() { printf '[gpu-wheel] ERROR: %s\n' "$*" >&2; exit 1; }

python="${HVDTRAIN_GPU_PYTHON:-}"
if [[ -z "$python" ]]; then
  if command -v pyenv >/dev/null && PYENV_VERSION=3.12.1 pyenv which python3.12 >/dev/null 2>&1; then
    python="$(PYENV_VERSION=3.12.1 pyenv which python3.12)"
  else
    python="$(command -v python3.12 || true)"
  fi
fi
[[ -x "$python" ]] || die "no Python 3.12 found: set HVDTRAIN_GPU_PYTHON to the GPU machine's minor version"
[[ -x "$cuda_home/bin/nvcc" ]] || die "no nvcc in CUDA_HOME=$cuda_home/bin (install the CUDA toolkit or set CUDA_HOME)"
pyver="$("$python" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')"
venv="$cache/gpu-venv-$pyver-${torch_spec//[^A-Za-z0-9.]/}"

if [[ ! -x "$venv/bin/python" ]]; then
  say "build venv $venv ($python)"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  say "installing $torch_spec (its CUDA build and the NCCL wheel it pins: several GB from PyPI)"
  "${pip[@]}" install "$torch_spec"
fi
"${pip[@]}" install "${BUILD_SPECS[@]}"
read -r torch_version torch_cuda nccl_version site < <("$venv/bin/python" - <<'PY'
import importlib.metadata as m, sysconfig, torch
print(torch.__version__, torch.version.cuda, m.version("nvidia-nccl-cu13"), sysconfig.get_paths()["purelib"])
PY
)
nvcc_major="$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
[[ "$nvcc_major" == "${torch_cuda%%.*}" ]] \
  || die "nvcc in $cuda_home is CUDA $nvcc_major, torch $torch_version is built for CUDA $torch_cuda: set CUDA_HOME"
nccl="$site/nvidia/nccl"
[[ -f "$nccl/include/nccl.h" ]] || die "no nccl.h in $nccl (the nvidia-nccl-cu13 wheel)"
ln -sfn libnccl.so.2 "$nccl/lib/libnccl.so"   # CMake links the unversioned name

# nvcc's host compilations (Horovod's .cu kernels) parse as C++11 with plain g++; every other
# compilation goes through the C++17 wrapper that install.sh uses.
host_cxx="$cache/gpu-host-cxx.sh"
printf '%s\n' '#!/bin/sh' 'case "$*" in *__CUDA_ARCH_LIST__*|*tmpxft_*) exec g++ "$@" ;; esac' \
  "exec \"$repo/scripts/cxx17-wrapper.sh\" \"\$@\"" > "$host_cxx"
chmod +x "$host_cxx"
recipe_hash="$(cat "$0" "$repo/scripts/cxx17-wrapper.sh" | sha256sum | cut -c1-12)"
key="horovod-0.28.1-$pyver-torch$torch_version-nccl$nccl_version-cc${cc_list//,/.}-$recipe_hash"
wheels="$cache/wheels/$key"

if ! compgen -G "$wheels/horovod-*.whl" >/dev/null; then
  say "building $HOROVOD_SPEC: torch $torch_version (CUDA $torch_cuda), NCCL $nccl_version, sm_$cc_list; cache: $wheels"
  log="$cache/gpu-build.log"
  rm -rf "$wheels.tmp"
  if ! PATH="$venv/bin:$cuda_home/bin:$PATH" \
       HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
       HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
       CUDA_HOME="$cuda_home" HOROVOD_CUDA_HOME="$cuda_home" HOROVOD_NCCL_HOME="$nccl" \
       HOROVOD_BUILD_CUDA_CC_LIST="$cc_list" CXX="$host_cxx" HVDTRAIN_REAL_CXX=g++ \
       CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
       "${pip[@]}" wheel --no-cache-dir --no-deps --no-build-isolation -w "$wheels.tmp" "$HOROVOD_SPEC" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "Horovod's GPU build failed (full log: $log)"
  fi
  mv "$wheels.tmp" "$wheels"
else
  say "cached: $wheels"
fi
mkdir -p "$out"
rm -f "$out"/horovod-*.whl
cp "$wheels"/horovod-*.whl "$out/"
printf '%s\n' "$key" > "$out/horovod-wheel.key"
# hvdtrain's own dependencies that the lent GPU machine's image lacks (it has torch, NumPy, Pillow,
# OpenCV, click, PyYAML, psutil, cloudpickle, TensorBoard, transformers and scikit-image)
"$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$out" \
  "$(sed -n 's/^ *\(simplejpeg==[0-9.]*\).*/\1/p' "$repo/setup.cfg")" || die "could not download simplejpeg's wheel"
say "done: $(ls "$out"/horovod-*.whl) ($(du -h "$out"/horovod-*.whl | cut -f1))"
