#!/usr/bin/env bash
# Make a Docker engine with BuildKit usable, and print the docker client that builds with it.
#
#   docker="$(bash scripts/docker-daemon.sh)"     # then: DOCKER_BUILDKIT=1 "$docker" build ...
#
# Uses a running engine if there is one. Otherwise, as root on Debian/Ubuntu, installs the
# distribution's `docker.io` (dockerd, containerd, runc) with apt-get and starts dockerd in the
# background (log: /var/log/hvdtrain-dockerd.log). The printed client is the first of `docker`,
# /usr/bin/docker that builds with BuildKit: a client with the buildx plugin, or a client older
# than 23 (BuildKit built in). A newer client without buildx falls back to the legacy builder,
# which cannot run the Dockerfiles' `RUN --mount`. Exits non-zero with one line saying why not.
set -euo pipefail

say() { printf '[hvdtrain docker] %s\n' "$*" >&2; }
die() { printf '[hvdtrain docker] ERROR: %s\n' "$*" >&2; exit 1; }

engine_up() { local c; for c in docker /usr/bin/docker; do command -v "$c" >/dev/null && timeout 20 "$c" info >/dev/null 2>&1 && return 0; done; return 1; }

# One installer and one dockerd at a time: the Docker test modules start side by side on a machine
# without Docker (a fresh CI machine), and two apt-get runs at once fail on dpkg's lock.
{ exec 9>>"${HVDTRAIN_DOCKER_LOCK:-/tmp/hvdtrain-docker-setup.lock}"; } 2>/dev/null || exec 9</dev/null
flock 9
if ! engine_up; then
  dockerd="$(command -v dockerd || echo /usr/sbin/dockerd)"
  if [[ ! -x "$dockerd" ]]; then
    [[ "$(id -u)" == 0 ]] || die "no Docker engine is running and installing one needs root"
    command -v apt-get >/dev/null || die "no Docker engine is running and apt-get is not available to install docker.io"
    say "installing docker.io with apt-get (about 30 s)"
    bash "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" docker.io >/var/log/hvdtrain-docker-install.log 2>&1 \
      || die "apt-get install docker.io failed (see /var/log/hvdtrain-docker-install.log)"
  fi
  [[ "$(id -u)" == 0 ]] || die "dockerd is installed but not running, and starting it needs root"
  say "starting dockerd (log: /var/log/hvdtrain-dockerd.log)"
  nohup "$dockerd" >/var/log/hvdtrain-dockerd.log 2>&1 9>&- &
  for _ in $(seq 60); do engine_up && break; sleep 1; done
  engine_up || die "dockerd did not come up within 60 s (see /var/log/hvdtrain-dockerd.log)"
fi
flock -u 9

for client in docker /usr/bin/docker; do
  command -v "$client" >/dev/null || continue
  timeout 20 "$client" info >/dev/null 2>&1 || continue
  if "$client" buildx version >/dev/null 2>&1; then echo "$(command -v "$client")"; exit 0; fi
  major="$("$client" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)"
  if [[ "$major" =~ ^[0-9]+$ ]] && (( major < 23 )); then echo "$(command -v "$client")"; exit 0; fi
done
die "no docker client here builds with BuildKit: install the buildx plugin (docker-buildx-plugin) or Debian's docker.io client"
