"""Give a ``docker build`` this machine's pip configuration, without baking it into the image.

::

    python3 docker/pip_relay.py --out DIR --bind 172.17.0.1   # prints "ready" and serves until killed

Reads pip's effective configuration here (``pip config list``: files and ``PIP_*`` variables, the
variables winning) and writes ``DIR/pip.conf`` for the build, passed as a BuildKit secret
(``--secret id=pip.conf,src=DIR/pip.conf``). Options naming local things are rewritten so the
build can reach them: ``file://`` indexes, local ``find-links`` folders and ``constraint`` /
``requirement`` files are served read-only over HTTP on ``--bind`` (the address of Docker's
bridge on this machine: build steps, and every container of this host, reach it) and named by
that URL, with the relay marked as a trusted host. Only those files and index trees are served
(never their parent folders, never a directory listing), behind a random path token that only
the build's secret pip.conf holds (see :class:`Relay`). The CA bundle (``cert``) is not copied into pip.conf:
its path is written to ``DIR/cert-path`` so the caller passes it as the secret ``pip-ca``.
Index URLs (which may carry credentials) exist only in the secret, never in a layer.
"""

from __future__ import annotations

import argparse
import html
import http.server
import os
import re
import secrets
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


DIST_SUFFIXES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")
NESTED = re.compile(r"^\s*(?:-r|-c|--requirement|--constraint)(?:\s*=\s*|\s+)(\S+)")
LINK = re.compile(r"""href\s*=\s*["']([^"'#?]+)""", re.IGNORECASE)


class Relay:
    """Named local files and index trees served read-only under a random path token.

    Only what pip's configuration names is served, each under its own absolute path behind
    ``/TOKEN`` (so an index page's relative links resolve): a constraint or requirement file (and
    the files it includes with ``-r``/``-c``), the files of a ``file://`` index tree (a folder
    answers with its ``index.html`` only) and the files its pages link to (simple indexes link
    ``../../files/pkg.whl``), and the distributions of a ``find-links`` folder (on a generated page
    naming them only). No directory listing, nothing beside them: a constraint file in ``$HOME``
    does not share ``~/.ssh``. Every container on Docker's bridge reaches the port; only the build,
    whose pip.conf secret holds the token, knows the URLs."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.files: set[Path] = set()          # regular files served as they are
        self.trees: set[Path] = set()          # index trees: their files, a folder's index.html
        self.link_pages: dict[Path, list[Path]] = {}  # find-links folders -> their distributions

    @property
    def roots(self) -> list[Path]:
        """Everything served (files, index trees, find-links folders)."""
        return sorted(self.files | self.trees | set(self.link_pages))

    def url(self, base: str, path: Path, index: bool = False) -> str:
        """Register a local file or folder (an index tree when ``index``) and return its relay URL."""
        path = path.resolve()
        if path.is_dir() and index:
            self.trees.add(path)
            for page in path.rglob("*.htm*"):
                self._allow_links(page)
        elif path.is_dir():
            self.link_pages[path] = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(DIST_SUFFIXES))
        else:
            self._allow_file(path)
        return f"{base}/{self.token}{quote(str(path))}" + ("/" if path.is_dir() else "")

    def _allow_file(self, path: Path) -> None:
        """A constraint or requirement file, and the files it includes (relative to it)."""
        if path in self.files or not path.is_file():
            return
        self.files.add(path)
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return
        for line in lines:
            match = NESTED.match(line)
            if match and "://" not in match.group(1):
                self._allow_file((path.parent / match.group(1)).resolve())

    def _allow_links(self, page: Path) -> None:
        """The local files an index page links to (relative links, e.g. ``../../files/pkg.whl``)."""
        try:
            text = page.read_text(errors="replace")
        except OSError:
            return
        for href in LINK.findall(text):
            if "://" in href or href.startswith("/"):
                continue
            target = (page.parent / unquote(href)).resolve()
            if target.is_file():
                self.files.add(target)

    def resolve(self, url_path: str) -> tuple[Path | None, bytes | None]:
        """(the file to send, or a generated page) for a request path; (None, None) if not served."""
        prefix = f"/{self.token}/"
        path = unquote(urlparse(url_path).path)
        if not path.startswith(prefix):
            return None, None
        target = Path("/" + path[len(prefix):].lstrip("/")).resolve()
        if target in self.link_pages:
            links = "".join(f'<a href="{quote(p.name)}">{html.escape(p.name)}</a><br>\n'
                            for p in self.link_pages[target])
            return None, f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
        if target.is_dir() and any(target == t or t in target.parents for t in self.trees):
            target = target / "index.html"
        allowed = target in self.files or any(
            t in target.parents and not any(part.startswith(".") for part in target.relative_to(t).parts)
            for t in self.trees) or any(target in pages for pages in self.link_pages.values())
        return (target, None) if allowed and target.is_file() else (None, None)

    def handler(self):
        """An HTTP handler class serving what is registered, read-only (GET and HEAD only)."""
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self.do_GET(body=False)

            def do_GET(self, body: bool = True) -> None:
                path, page = relay.resolve(self.path)
                try:
                    data = page if page is not None else path.read_bytes() if path is not None else None
                except OSError:
                    data = None
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if page is not None or path.suffix in (".html", ".htm")
                                 else "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

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
        print(f"pip_relay: serving {root}", file=sys.stderr)  # the URL (its token) stays in the secret
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
