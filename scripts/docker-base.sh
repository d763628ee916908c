#!/usr/bin/env bash
# Make a Debian bookworm base image without a container registry: debootstrap's minbase variant
# from the Debian mirror apt already uses, imported with `docker import`.
#
#   bash scripts/docker-base.sh [IMAGE]            # default IMAGE: local/bookworm:minbase
#
# For machines that cannot pull `debian:bookworm-slim` (no registry, only a package mirror);
# scripts/docker-build.sh calls it when the base image is neither present nor pullable. Needs root
# (debootstrap) and about 80 s and 210 MB. Environment: DOCKER (the client), DEBIAN_MIRROR
# (default: the first deb.debian.org-style URI in apt's sources, else http://deb.debian.org/debian).
set -euo pipefail

image="${1:-local/bookworm:minbase}"
docker="${DOCKER:-docker}"
say() { printf '[hvdtrain docker] %s\n' "$*" >&2; }
die() { printf '[hvdtrain docker] ERROR: %s\n' "$*" >&2; exit 1; }

# One debootstrap at a time (the Docker test modules build side by side): a second caller waits,
# then finds the image the first one imported.
{ exec 9>>"${HVDTRAIN_DOCKER_LOCK:-/tmp/hvdtrain-docker-setup.lock}.base"; } 2>/dev/null || exec 9</dev/null
flock 9
if "$docker" image inspect "$image" >/dev/null 2>&1; then
  say "base image $image is present"
  exit 0
fi
[[ "$(id -u)" == 0 ]] || die "debootstrap needs root to make the base image $image"
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap with apt-get"
  bash "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" debootstrap >/dev/null \
    || die "apt-get install debootstrap failed"
fi
mirror="${DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -v '^\s*#' | grep -oE '(https?)://[^ ]+/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ')" || true
fi
mirror="${mirror:-http://deb.debian.org/debian}"
rootfs="$(mktemp -d /tmp/hvdtrain-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
say "debootstrap bookworm (minbase) from $mirror (about 80 s)"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
  || { tail -n 20 "$rootfs.log" >&2; die "debootstrap failed (log above)"; }
rm -f "$rootfs.log"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | "$docker" import - "$image" >/dev/null
say "imported $image"
