#!/usr/bin/env bash
# apt-get update + install of the named packages that waits its turn when another apt-get runs
# (the set-up installs nginx while .ci/run installs docker.io and debootstrap beside it).
#
#   bash scripts/apt-install.sh [apt-get install option...] PACKAGE...   (root; output is apt-get's)
#
# apt-get install waits for dpkg's lock with DPkg::Lock::Timeout; apt-get update does not wait
# for the lists lock (it fails at once, "Could not get lock /var/lib/apt/lists/lock"), so it is
# tried again every 3 s, for up to 10 minutes, while that is the reason it failed.
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: scripts/apt-install.sh PACKAGE..." >&2; exit 2; }
log="$(mktemp)"; trap 'rm -f "$log"' EXIT
for try in $(seq 200); do
  if apt-get update -qq -o DPkg::Lock::Timeout=600 >"$log" 2>&1; then break; fi
  cat "$log" >&2
  grep -q "Could not get lock" "$log" && (( try < 200 )) || exit 1
  sleep 3
done
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "$@"
