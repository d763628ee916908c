"""The remote-shard tests' HTTP server: ``scripts/http-server.sh`` (Debian's nginx, range requests)
serving a folder on a free loopback port, started and stopped by the test that needs it."""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from jobs import REPO
from trackers_support import free_port


@contextlib.contextmanager
def http_server(root: Path, probe: str) -> Iterator[str]:
    """Serve ``root``; yields the base URL once the file ``probe`` (relative to ``root``) answers.
    The script installs nginx with apt-get when it is missing (``make setup`` does it beforehand)."""
    port = free_port()
    proc = subprocess.Popen([str(REPO / "scripts" / "http-server.sh"), str(root), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"{url}/{probe}", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"scripts/http-server.sh ended: {proc.stderr.read()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"scripts/http-server.sh did not serve {url}/{probe} within 300 s")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
