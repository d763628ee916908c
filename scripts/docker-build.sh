#!/usr/bin/env bash
# Build an hvdtrain image with this machine's pip set-up and its cached Horovod wheel.
#
#   bash scripts/docker-build.sh [TAG]          # or: make docker-cpu     (default TAG: hvdtrain:cpu)
#   bash scripts/docker-build.sh -f docker/Dockerfile.gpu [TAG]   # or: make docker-gpu (hvdtrain:gpu)
#
#   bash scripts/docker-build.sh --base-only    # steps 1 and 2 only: the engine and the base image
#                                               # (.ci/run makes them beside `make setup`)
# -f DOCKERFILE: the Dockerfile to build (default docker/Dockerfile.cpu); the default TAG is
# hvdtrain:<its suffix>. Only the CPU build gets torch's CPU index (step 5).
# 1. a Docker engine with BuildKit (scripts/docker-daemon.sh: starts or installs one when root);
# 2. the base image: $HVDTRAIN_DOCKER_BASE (default debian:bookworm-slim) if present or pullable,
#    else a debootstrap import made by scripts/docker-base.sh (local/bookworm:minbase);
# 3. the Horovod/mpi4py wheels of ~/.cache/hvdtrain/wheels (scripts/install.sh's cache) hard-linked
#    into docker/wheels, which the build bind-mounts: a matching wheel is not compiled again;
# 4. this machine's pip configuration (index, extra indexes, find-links, constraints) as a BuildKit
#    secret; local folders in it are served to the build by docker/pip_relay.py on Docker's bridge
#    address for the build's duration; pip's CA bundle as the secret pip-ca. Nothing of it is
#    stored in the image;
# 5. torch's CPU index ($HVDTRAIN_TORCH_INDEX_URL, default https://download.pytorch.org/whl/cpu)
#    is added only when it is reachable from here (else torch comes from the pip configuration).
# Prints the build time and the image size. Environment: HVDTRAIN_CACHE, HVDTRAIN_DOCKER_BASE,
# HVDTRAIN_TORCH_INDEX_URL, HVDTRAIN_DOCKER_PROGRESS (auto|plain), HVDTRAIN_NO_PIP_CONFIG=1 (build
# with pip's defaults, as on a machine with internet).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dockerfile="docker/Dockerfile.cpu"
base_only=0
if [[ "${1:-}" == "--base-only" ]]; then base_only=1; shift; fi
if [[ "${1:-}" == "-f" ]]; then
  [[ -n "${2:-}" ]] || { echo "[hvdtrain docker] ERROR: -f needs a Dockerfile (docker/Dockerfile.cpu or docker/Dockerfile.gpu)" >&2; exit 2; }
  dockerfile="$2"
  shift 2
fi
[[ -f "$repo/$dockerfile" ]] || { echo "[hvdtrain docker] ERROR: no Dockerfile $dockerfile (give docker/Dockerfile.cpu or docker/Dockerfile.gpu)" >&2; exit 2; }
tag="${1:-hvdtrain:${dockerfile##*.}}"
cache="${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}"
base="${HVDTRAIN_DOCKER_BASE:-debian:bookworm-slim}"
torch_index="${HVDTRAIN_TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
[[ "${dockerfile##*/}" == Dockerfile.cpu ]] || torch_index=""  # torch's CUDA build is PyPI's own
say() { printf '[hvdtrain docker] %s\n' "$*" >&2; }
die() { printf '[hvdtrain docker] ERROR: %s\n' "$*" >&2; exit 1; }
cd "$repo"
start=$(date +%s)

docker="$(bash scripts/docker-daemon.sh)"
export DOCKER="$docker" DOCKER_BUILDKIT=1

if ! "$docker" image inspect "$base" >/dev/null 2>&1 && ! timeout 300 "$docker" pull -q "$base" >/dev/null 2>&1; then
  say "base image $base is not present and cannot be pulled; using a debootstrap import"
  base="local/bookworm:minbase"
  bash scripts/docker-base.sh "$base"
fi
if (( base_only )); then say "engine and base image $base ready in $(( $(date +%s) - start )) s"; exit 0; fi

find docker/wheels -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
staged=0
for dir in "$cache"/wheels/horovod-* "$cache"/wheels/mpi4py-*; do
  [[ -d "$dir" && "$dir" != *.tmp* ]] || continue
  cp -al "$dir" docker/wheels/ 2>/dev/null || cp -a "$dir" docker/wheels/
  staged=$((staged + 1))
done
say "wheel cache: $staged folder(s) from $cache/wheels offered to the build"

secrets=()
relay_pid=""
trap '[[ -n "$relay_pid" ]] && kill "$relay_pid" 2>/dev/null; rm -rf "${work:-}"' EXIT
work="$(mktemp -d /tmp/hvdtrain-docker-build.XXXXXX)"
if [[ "${HVDTRAIN_NO_PIP_CONFIG:-0}" != 1 ]]; then
  # the host's address on Docker's default bridge, which build steps use as their network
  gateway="$("$docker" network inspect bridge --format '{{range .IPAM.Config}}{{.Gateway}}{{end}}' 2>/dev/null || true)"
  [[ -n "$gateway" ]] || gateway="$(ip -4 -o addr show docker0 2>/dev/null | awk '{print $4}' | cut -d/ -f1)"
  [[ -n "$gateway" ]] || die "cannot find this machine's address on Docker's bridge (docker0)"
  extra=()
  if [[ -n "$torch_index" ]] && timeout 15 python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=10)" "$torch_index/torch/" 2>/dev/null; then
    extra=(--extra-index-url "$torch_index")
  fi
  python3 "$repo/docker/pip_relay.py" --out "$work" --bind "$gateway" "${extra[@]}" >"$work/relay.out" 2>"$work/relay.log" &
  relay_pid=$!
  for _ in $(seq 50); do grep -q ready "$work/relay.out" 2>/dev/null && break; sleep 0.2; done
  grep -q ready "$work/relay.out" || { cat "$work/relay.log" >&2; die "the pip relay did not start"; }
  sed 's/^/[hvdtrain docker] /' "$work/relay.log" >&2
  secrets+=(--secret "id=pip.conf,src=$work/pip.conf")
  cert="$(cat "$work/cert-path")"
  [[ -n "$cert" ]] && secrets+=(--secret "id=pip-ca,src=$cert")
  torch_index=""  # the pip configuration decides (with torch's index added above when reachable)
fi

build=(build)
if "$docker" buildx version >/dev/null 2>&1; then build=(buildx build --load); fi
say "building $tag from $base ($dockerfile) with $docker ${build[*]}"
"$docker" "${build[@]}" -f "$dockerfile" -t "$tag" --progress="${HVDTRAIN_DOCKER_PROGRESS:-plain}" \
  --build-arg BASE_IMAGE="$base" --build-arg TORCH_INDEX_URL="$torch_index" "${secrets[@]}" . \
  || die "docker build failed (output above)"
size="$("$docker" image inspect "$tag" --format '{{.Size}}')"
say "built $tag in $(( $(date +%s) - start )) s; image size $(( size / 1000000 )) MB"
