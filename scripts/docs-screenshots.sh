#!/usr/bin/env bash
# Screenshots of the built documentation site in headless Chromium (Debian's `chromium`), to look at
# how pages render (navigation sidebar, search box, tables): the home page, the config-key reference,
# the own-model guide and the quickstart notebook (rendered from its stored outputs), each at a desktop width.
#   bash scripts/docs-screenshots.sh [SITE_DIR] [OUT_DIR]
# SITE_DIR: the built site (default docs/_build/html; `make docs` builds it); OUT_DIR: where the PNGs
# go (default docs/_build/screenshots). Needs chromium (as root on Debian: apt-get install chromium).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
site="$(realpath "${1:-$repo/docs/_build/html}")"
out="$(realpath -m "${2:-$repo/docs/_build/screenshots}")"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
[[ -n "$browser" ]] || { echo "docs-screenshots: no chromium on PATH (apt-get install chromium)" >&2; exit 1; }
[[ -f "$site/index.html" ]] || { echo "docs-screenshots: $site/index.html not found: run make docs first" >&2; exit 1; }
mkdir -p "$out"
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
for page in index reference/config guides/own-model guides/quickstart; do
  png="$out/$(echo "$page" | tr / -).png"
  "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
      --window-size=1400,1000 --screenshot="$png" "file://$site/$page.html" >/dev/null 2>&1
  [[ -s "$png" ]] || { echo "docs-screenshots: chromium wrote no $png" >&2; exit 1; }
  echo "$png"
done
