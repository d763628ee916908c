#!/usr/bin/env bash
# Entrypoint of the hvdtrain images: runs `hvdtrain ARGS...`, or a launcher/tool given by name.
#
#   docker run hvdtrain:cpu recipe image-classification ...   -> hvdtrain recipe image-classification ...
#   docker run hvdtrain:cpu horovodrun -np 2 -H localhost:2 hvdtrain recipe ...
#   docker run hvdtrain:cpu worker                              -> sshd in the foreground (a node of a
#                                                                  multi-node job; docs/guides/docker.md)
#
# SSH for multi-node jobs: mount a key pair (id_ed25519 and id_ed25519.pub; id_ecdsa or id_rsa
# also work) at $HVDTRAIN_SSH_KEYS (default /etc/hvdtrain/ssh) on every node. It becomes the user's
# identity and authorized key, and it vouches for the hosts: sshd's host keys are made here, when a
# container first starts (the image holds none, so no two containers share them), and the host
# key is signed with the pair as a certificate authority; ssh trusts a host only when it shows such
# a certificate (`@cert-authority` line in ~/.ssh/known_hosts, StrictHostKeyChecking yes in the
# image's ssh_config). With HVDTRAIN_SSHD=1 every container also starts sshd on
# $HVDTRAIN_SSH_PORT (default 2222).
set -euo pipefail

keys="${HVDTRAIN_SSH_KEYS:-/etc/hvdtrain/ssh}"
port="${HVDTRAIN_SSH_PORT:-2222}"
ssh_dir="${HOME:-/root}/.ssh"

identity=""
for name in id_ed25519 id_ecdsa id_rsa; do
  if [[ -f "$keys/$name" && -f "$keys/$name.pub" ]]; then identity="$name"; break; fi
done

if [[ -n "$identity" ]]; then
  mkdir -p "$ssh_dir" && chmod 700 "$ssh_dir"
  public="$(cat "$keys/$identity.pub")"
  install -m 600 "$keys/$identity" "$ssh_dir/$identity"
  install -m 644 "$keys/$identity.pub" "$ssh_dir/$identity.pub"
  if ! grep -qxF "$public" "$ssh_dir/authorized_keys" 2>/dev/null; then
    echo "$public" >> "$ssh_dir/authorized_keys"
  fi
  if ! grep -qxF "@cert-authority * $public" "$ssh_dir/known_hosts" 2>/dev/null; then
    echo "@cert-authority * $public" >> "$ssh_dir/known_hosts"
  fi
  chmod 600 "$ssh_dir/authorized_keys" "$ssh_dir/known_hosts"
fi

# sshd with this container's own host keys (made at its first start, kept across restarts), the
# ed25519 one certified by the mounted key pair.
if [[ "${1:-}" == "worker" || "${HVDTRAIN_SSHD:-0}" == 1 ]]; then
  ssh-keygen -A >/dev/null
  sshd_args=(-p "$port")
  if [[ -n "$identity" ]]; then
    ssh-keygen -q -s "$ssh_dir/$identity" -I "hvdtrain-host-$(hostname)" -h /etc/ssh/ssh_host_ed25519_key.pub
    sshd_args+=(-o HostCertificate=/etc/ssh/ssh_host_ed25519_key-cert.pub)
  fi
  if [[ "${1:-}" == "worker" ]]; then
    exec /usr/sbin/sshd -D -e "${sshd_args[@]}"
  fi
  /usr/sbin/sshd "${sshd_args[@]}"
fi

case "${1:-}" in
  "") exec hvdtrain --help ;;
  hvdtrain|horovodrun|mpirun|python|python3|tensorboard|bash|sh|ssh|/*) exec "$@" ;;
  *) exec hvdtrain "$@" ;;
esac
