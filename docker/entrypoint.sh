#!/usr/bin/env bash
# Entrypoint of the hvdtrain images: runs `hvdtrain ARGS...`, or a launcher/tool given by name.
#
#   docker run hvdtrain:cpu recipe image-classification ...   -> hvdtrain recipe image-classification ...
#   docker run hvdtrain:cpu horovodrun -np 2 -H localhost:2 hvdtrain recipe ...
#   docker run hvdtrain:cpu worker                              -> sshd in the foreground (a node of a
#                                                                  multi-node job; README: "Docker images")
#
# SSH for multi-node jobs: mount a key pair (id_ed25519, id_ed25519.pub) at $HVDTRAIN_SSH_KEYS
# (default /etc/hvdtrain/ssh) on every node; it becomes the user's identity and authorized key. With
# HVDTRAIN_SSHD=1 every container also starts sshd on $HVDTRAIN_SSH_PORT (default 2222).
set -euo pipefail

keys="${HVDTRAIN_SSH_KEYS:-/etc/hvdtrain/ssh}"
port="${HVDTRAIN_SSH_PORT:-2222}"
ssh_dir="${HOME:-/root}/.ssh"

if [[ -f "$keys/id_ed25519" && -f "$keys/id_ed25519.pub" ]]; then
  mkdir -p "$ssh_dir" && chmod 700 "$ssh_dir"
  install -m 600 "$keys/id_ed25519" "$ssh_dir/id_ed25519"
  install -m 644 "$keys/id_ed25519.pub" "$ssh_dir/id_ed25519.pub"
  if ! grep -qxF "$(cat "$keys/id_ed25519.pub")" "$ssh_dir/authorized_keys" 2>/dev/null; then
    cat "$keys/id_ed25519.pub" >> "$ssh_dir/authorized_keys"
  fi
  chmod 600 "$ssh_dir/authorized_keys"
fi

if [[ "${1:-}" == "worker" ]]; then
  exec /usr/sbin/sshd -D -e -p "$port"
fi
if [[ "${HVDTRAIN_SSHD:-0}" == 1 ]]; then
  /usr/sbin/sshd -p "$port"
fi

case "${1:-}" in
  "") exec hvdtrain --help ;;
  hvdtrain|horovodrun|mpirun|python|python3|tensorboard|bash|sh|ssh|/*) exec "$@" ;;
  *) exec hvdtrain "$@" ;;
esac
