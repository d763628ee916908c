"""Give a ``docker build`` this machine's pip configuration, without baking it into the image.

::

    python3 docker/pip_relay.py --out DIR --bind 172.17.0.1   # prints "ready" and serves until killed

Reads pip's effective configuration here (``pip config list``: files and ``PIP_*`` variables, the
variables winning) and writes ``DIR/pip.conf`` for the build, passed as a BuildKit secret
(``--secret id=pip.conf,src=DIR/pip.conf``). Options naming local things are rewritten so the
build can reach them: ``file://`` indexes, local ``find-links`` folders and ``constraint`` /
``requirement`` files are served read-only over HTTP on ``--bind`` (the address of Docker's
bridge on this machine, reachable from build steps and nothing else) and named by that URL,
with the relay marked as a trusted host. The CA bundle (``cert``) is not copied into pip.conf:
its path is written to ``DIR/cert-path`` so the caller passes it as the secret ``pip-ca``.
Index URLs (which may carry credentials) exist only in the secret, never in a layer.
"""

from __future__ import annotations

import argparse
import http.server
import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

URL_OPTIONS = ("index-url", "extra-index-url", "find-links")
FILE_OPTIONS = ("constraint", "requirement")
SECTIONS = ("global", "install", "download", "wheel")


def host_pip_config() -> dict[str, str]:
    """pip's effective options on this machine (``name -> value``), environment variables last."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         check=True).stdout
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in out.splitlines():
        match = re.match(r"^(:env:|[\w-]+)\.([\w-]+)='(.*)'$", line.strip())
        if not match:
            continue
        section, name, value = match.groups()
        if section == ":env:":
            env[name] = value
        elif section in SECTIONS:
            files[name] = value
    return {**files, **env}


class Relay:
    """Local folders and files served read-only under their own absolute paths.

    An index folder's parent is served too: simple indexes link their files relatively
    (``simple/pkg/index.html`` -> ``../../files/pkg.whl``)."""

    def __init__(self) -> None:
        self.roots: list[Path] = []

    def url(self, base: str, path: Path, index: bool = False) -> str:
        """The relay URL of a local folder or file."""
        path = path.resolve()
        root = path.parent if index or not path.is_dir() else path
        if root not in self.roots:
            self.roots.append(root)
        return base + quote(str(path)) + ("/" if path.is_dir() else "")

    def handler(self):
        """An HTTP handler class serving the registered roots, read-only."""
        roots = self.roots

        class Handler(http.server.SimpleHTTPRequestHandler):
            def translate_path(self, path: str) -> str:
                target = Path("/" + unquote(urlparse(path).path).lstrip("/")).resolve()
                allowed = any(target == root or root in target.parents for root in roots)
                return str(target) if allowed else "/nonexistent-hvdtrain-relay"

            def log_message(self, *args) -> None:  # quiet: pip fetches hundreds of pages
                pass

        return Handler


def rewrite(options: dict[str, str], relay: Relay, base: str) -> tuple[dict[str, str], str | None]:
    """(options for the build's pip.conf, the CA bundle path or None)."""
    result: dict[str, str] = {}
    cert = options.get("cert")
    for name, value in options.items():
        if name in ("cert", "client-cert", "cache-dir", "log", "target", "prefix", "root", "src"):
            continue  # machine-local, or passed separately (cert)
        if name in URL_OPTIONS or name in FILE_OPTIONS:
            items = []
            for item in shlex.split(value):
                parsed = urlparse(item)
                local = Path(unquote(parsed.path)) if parsed.scheme == "file" else \
                    Path(item) if not parsed.scheme else None
                if local is None:
                    items.append(item)
                elif local.exists():
                    items.append(relay.url(base, local, index=name.endswith("index-url")))
                else:
                    print(f"pip_relay: skipping {name}={item}: it does not exist here", file=sys.stderr)
            if items:
                result[name] = " ".join(items)
        else:
            result[name] = value
    if relay.roots:
        host = urlparse(base).netloc
        result["trusted-host"] = " ".join(filter(None, [result.get("trusted-host", ""), host]))
    return result, cert


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for pip.conf and cert-path")
    parser.add_argument("--bind", default="127.0.0.1", help="address to serve local folders on")
    parser.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    parser.add_argument("--extra-index-url", action="append", default=[], help="another index to add")
    args = parser.parse_args()

    relay = Relay()
    server = http.server.ThreadingHTTPServer((args.bind, args.port), relay.handler())
    base = f"http://{args.bind}:{server.server_address[1]}"
    options, cert = rewrite(host_pip_config(), relay, base)
    if args.extra_index_url:
        options["extra-index-url"] = " ".join(filter(None, [options.get("extra-index-url", ""), *args.extra_index_url]))
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["[global]"] + [f"{name} = {value}" for name, value in options.items()]
    (args.out / "pip.conf").write_text("\n".join(lines) + "\n")
    (args.out / "cert-path").write_text(cert if cert and Path(cert).is_file() else "")
    for root in relay.roots:
        print(f"pip_relay: serving {root} at {base}{quote(str(root))}/", file=sys.stderr)
    print("ready", flush=True)
    if not relay.roots:
        return  # nothing local to serve
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        os._exit(0)


if __name__ == "__main__":
    main()
