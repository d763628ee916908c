#!/usr/bin/env bash
# A static HTTP server with range requests (Debian's nginx) serving one folder on loopback: the
# remote-shard tests' server, and a user's quick way to serve shards to a few hosts.
#
#   scripts/http-server.sh --setup            install nginx with apt-get if it is missing, then exit
#   scripts/http-server.sh ROOT PORT [ADDR]   serve ROOT on ADDR:PORT (default 127.0.0.1) in the
#                                             foreground until SIGTERM/SIGINT; its config, pid and
#                                             logs live in a temporary folder removed at exit
#
# nginx answers Range requests on static files (206 with Content-Range), HEAD with Content-Length,
# and lists folders (autoindex on, JSON) so a folder URL can be globbed. As root its workers run as
# root, so files in folders only root may read (pytest's temporary folders) are served too.
set -euo pipefail
say() { printf '[hvdtrain http] %s\n' "$*" >&2; }
die() { printf '[hvdtrain http] ERROR: %s\n' "$*" >&2; exit 1; }

nginx_bin() { command -v nginx || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; } || true; }

if [[ -z "$(nginx_bin)" ]]; then
  [[ "$(id -u)" == 0 ]] || die "nginx is not installed and installing it needs root (apt-get install nginx-light or nginx)"
  command -v apt-get >/dev/null || die "nginx is not installed and apt-get is not available to install it"
  say "installing nginx with apt-get (once)"
  bash "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" --no-install-recommends nginx \
    >/var/log/hvdtrain-nginx-install.log 2>&1 || die "apt-get install nginx failed (see /var/log/hvdtrain-nginx-install.log)"
  # the package starts its own server on port 80 where a service manager runs; this script needs none
  { command -v service >/dev/null && service nginx stop; } >/dev/null 2>&1 || true
fi
[[ "${1:-}" == "--setup" ]] && exit 0

[[ $# -ge 2 ]] || die "usage: scripts/http-server.sh ROOT PORT [ADDR]"
root="$(cd "$1" 2>/dev/null && pwd)" || die "folder to serve does not exist: $1"
port="$2"; addr="${3:-127.0.0.1}"
[[ "$port" =~ ^[0-9]+$ ]] && (( port > 0 && port < 65536 )) || die "port must be 1-65535, got '$port'"

run="$(mktemp -d /tmp/hvdtrain-http.XXXXXX)"
trap 'rm -rf "$run"' EXIT
mkdir -p "$run/tmp"
user_line=""
[[ "$(id -u)" == 0 ]] && user_line="user root;"
cat >"$run/nginx.conf" <<EOF
$user_line
worker_processes 2;
pid $run/nginx.pid;
error_log $run/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_timeout 65;
  default_type application/octet-stream;
  client_body_temp_path $run/tmp;
  proxy_temp_path $run/tmp;
  fastcgi_temp_path $run/tmp;
  uwsgi_temp_path $run/tmp;
  scgi_temp_path $run/tmp;
  server {
    listen $addr:$port;
    root $root;
    location / { autoindex on; autoindex_format json; }
  }
}
EOF
"$(nginx_bin)" -t -q -c "$run/nginx.conf" -p "$run" || die "nginx refused its configuration (see above)"
say "serving $root on http://$addr:$port/"
"$(nginx_bin)" -c "$run/nginx.conf" -p "$run" -g 'daemon off;' &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; rm -rf "$run"' EXIT
trap 'exit 0' TERM INT
wait "$child"
