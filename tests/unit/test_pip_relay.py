"""docker/pip_relay.py for real: the relay process started as scripts/docker-build.sh starts it,
on a pip configuration naming a constraint file in a home folder that also holds ``.ssh/id_rsa``,
a ``file://`` simple index and a find-links folder; everything fetched over HTTP. Only the named
files and index trees are served, behind the token of the build's pip.conf; no listing, no key."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[2]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


@pytest.fixture
def home(tmp_path):
    """A user's home: a constraint file (including a second one) beside ~/.ssh, an index, wheels."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    (home / "notes.txt").write_text("private notes\n")
    (home / "constraints.txt").write_text("torch<=2.14\n-c more-constraints.txt\n")
    (home / "more-constraints.txt").write_text("numpy<3\n")
    page = home / "pypi" / "simple" / "pkg"
    page.mkdir(parents=True)
    (home / "pypi" / "files").mkdir()
    (home / "pypi" / "files" / "pkg-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (home / "pypi" / "files" / "unlisted.txt").write_text("not linked from the index\n")
    (page / "index.html").write_text('<a href="../../files/pkg-1.0-py3-none-any.whl#sha256=00">pkg</a>')
    (home / "wheels").mkdir()
    (home / "wheels" / "local-2.0-py3-none-any.whl").write_bytes(b"local wheel")
    (home / "wheels" / "README").write_text("not a distribution\n")
    return home


def test_relay_serves_only_the_named_files_behind_its_token(tmp_path, home, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # only the variables below
    monkeypatch.setenv("PIP_CONSTRAINT", str(home / "constraints.txt"))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", f"file://{home / 'pypi' / 'simple'}")
    monkeypatch.setenv("PIP_FIND_LINKS", str(home / "wheels"))
    monkeypatch.setenv("PIP_INDEX_URL", "https://user:secret@pypi.example/simple")
    out = tmp_path / "out"
    relay = subprocess.Popen([sys.executable, str(REPO / "docker" / "pip_relay.py"), "--out", str(out),
                              "--bind", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert relay.stdout.readline().strip() == "ready"
        conf = configparser.ConfigParser()
        conf.read(out / "pip.conf")
        options = dict(conf["global"])
        assert options["index-url"] == "https://user:secret@pypi.example/simple"  # only ever in the secret
        constraint, index, links = options["constraint"], options["extra-index-url"], options["find-links"]
        parsed = urlparse(constraint)
        base, token = f"{parsed.scheme}://{parsed.netloc}", parsed.path.split("/")[1]
        assert len(token) >= 20 and options["trusted-host"] == parsed.netloc
        assert constraint == f"{base}/{token}{home}/constraints.txt"

        # what pip needs
        assert _get(constraint) == (200, b"torch<=2.14\n-c more-constraints.txt\n")
        assert _get(f"{base}/{token}{home}/more-constraints.txt") == (200, b"numpy<3\n")  # its -c include
        status, page = _get(f"{index}pkg/")
        assert status == 200 and b"pkg-1.0-py3-none-any.whl" in page
        assert _get(f"{index}pkg/../../files/pkg-1.0-py3-none-any.whl") == (200, b"wheel")  # the relative link
        status, page = _get(links)
        assert status == 200 and b"local-2.0-py3-none-any.whl" in page and b"README" not in page
        assert _get(f"{links}local-2.0-py3-none-any.whl") == (200, b"local wheel")

        # nothing beside it: the key next to the constraint file, listings, files nobody named
        for path in (f"{home}/.ssh/id_rsa", f"{home}/notes.txt", f"{home}/pypi/files/unlisted.txt",
                     f"{home}/wheels/README", f"{home}/pypi/simple/pkg/../../../.ssh/id_rsa", "/etc/passwd"):
            assert _get(f"{base}/{token}{path}")[0] == 404, path
        for folder in (f"{home}/", f"{home}/.ssh/", f"{home}/pypi/", f"{home}/pypi/files/", "/"):
            assert _get(f"{base}/{token}{folder}")[0] == 404, folder  # no directory listing
        for guess in (f"{home}/constraints.txt", f"/wrong-token{home}/constraints.txt", f"/{token[:-1]}x{home}/constraints.txt"):
            assert _get(f"{base}{guess}")[0] == 404, guess  # without the token: nothing
    finally:
        relay.terminate()
        relay.wait(timeout=10)
