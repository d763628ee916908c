#!/usr/bin/env bash
# Start a Slurm daemon in a container of hvdtrain:slurm (docker/Dockerfile.slurm).
#
#   start.sh controller     munged, then slurmctld in the foreground
#   start.sh node           munged, then slurmd in the foreground (the container's host name is
#                           its node name)
#
# Environment (the same on every container of one cluster):
#   HVDTRAIN_MUNGE_KEY     the shared MUNGE key, mounted read-only (default /etc/hvdtrain/munge.key;
#                          make one with: dd if=/dev/urandom bs=1024 count=1 > munge.key)
#   HVDTRAIN_SLURM_CONTROLLER       the controller's host name (default ctl)
#   HVDTRAIN_SLURM_NODES            the compute nodes, Slurm host list syntax (default n[1-2])
#   HVDTRAIN_SLURM_CPUS             CPUs per node (default: this container's CPU count)
# With HVDTRAIN_SSHD=1 and a key pair mounted (docker/entrypoint.sh) a node also runs sshd, for
# `horovodrun -H` inside an allocation.
set -euo pipefail

die() { printf 'hvdtrain slurm: ERROR: %s\n' "$*" >&2; exit 1; }
role="${1:-}"
[[ "$role" == controller || "$role" == node ]] || die "usage: start.sh controller|node (got '${role}')"
key="${HVDTRAIN_MUNGE_KEY:-/etc/hvdtrain/munge.key}"
[[ -s "$key" ]] || die "no MUNGE key at $key: mount the cluster's shared key there (the same file on every container)"

install -d -o munge -g munge -m 700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 755 /run/munge
install -o munge -g munge -m 400 "$key" /etc/munge/munge.key
runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null || die "munged does not answer"

sed -e "s/@CONTROLLER@/${HVDTRAIN_SLURM_CONTROLLER:-ctl}/" -e "s/@NODES@/${HVDTRAIN_SLURM_NODES:-n[1-2]}/" \
    -e "s/@CPUS@/${HVDTRAIN_SLURM_CPUS:-$(nproc)}/" /opt/hvdtrain/docker/slurm/slurm.conf > /etc/slurm/slurm.conf
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm

if [[ "$role" == controller ]]; then
  exec /usr/sbin/slurmctld -D -i
fi
exec /usr/sbin/slurmd -D
