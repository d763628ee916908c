"""Issue 63, part B: remote shards against a hostile HTTP server on 127.0.0.1 (a real
``http.server`` in this process, answering HEAD with one size and GET with what it likes) and the
project's nginx (``scripts/http-server.sh``).

* a download never reads past the size it was given (the streamed spool's and the index build's);
* a ``manifest.json`` on a server is read only up to ``remote.MANIFEST_BYTES``: a larger size is
  refused before its body is asked for, a body larger than the cap is not read past it;
* URL joins stay on the shard's host (a shard at the server's root looked up
  ``http://manifest.json``, a host named "manifest.json");
* a server that stops sending mid-body fails after ``remote.READ_TIMEOUT``, while one that sends
  steadily for longer than that is read whole (aiohttp's default bounded the whole response by 300 s).

The witness of "not read past" is what the server counts it sent (the client closing stops it),
never a time."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hvdtrain.data import layouts, remote, shards
from hvdtrain.data.errors import DataError
from hvdtrain.data.shards import load_shard_index
from http_server import http_server

MIB = 1 << 20
NGINX = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
needs_nginx = pytest.mark.skipif(not NGINX and os.environ.get("CI") != "true",
                                 reason="nginx is not installed (scripts/http-server.sh --setup)")

pytestmark = pytest.mark.usefixtures("private_index_cache")


class Route:
    """What the hostile server answers for one path: ``head`` (the Content-Length HEAD says),
    ``content`` (bytes served first, range requests answered from them) and ``extra`` bytes of
    zeros sent after it in 1 MiB writes (GET's Content-Length says the truth), ``gaps``: seconds
    slept before each of ``content``'s bytes, ``stall``: GET says ``head`` bytes and stops sending
    after ``content`` until the test ends."""

    def __init__(self, head: int, content: bytes = b"", extra: int = 0, gaps: float = 0.0, stall: bool = False):
        self.head, self.content, self.extra, self.gaps, self.stall = head, content, extra, gaps, stall
        self.done = threading.Event()


class Hostile:
    """A ThreadingHTTPServer on 127.0.0.1 serving :class:`Route`s; ``sent[path]`` counts the body
    bytes written (until the client went away), ``gets[path]`` the GETs."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.sent: Counter = Counter()
        self.gets: Counter = Counter()
        self.ended = threading.Event()
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _route(self) -> Route | None:
                route = hostile.routes.get(self.path)
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                return route

            def do_HEAD(self) -> None:
                route = self._route()
                if route is not None:
                    self.send_response(200)
                    self.send_header("Content-Length", str(route.head))
                    self.send_header("ETag", '"v1"')
                    self.end_headers()

            def do_GET(self) -> None:
                route = self._route()
                if route is None:
                    return
                hostile.gets[self.path] += 1
                spec = self.headers.get("Range", "")
                try:
                    if spec.startswith("bytes=") and route.content and not route.extra:
                        start, _, end = spec[6:].partition("-")
                        part = route.content[int(start):int(end) + 1]
                        self.send_response(206)
                        self.send_header("Content-Length", str(len(part)))
                        self.send_header("Content-Range", f"bytes {start}-{int(start) + len(part) - 1}/{route.head}")
                        self.end_headers()
                        self.wfile.write(part)
                        return
                    self.send_response(200)
                    length = route.head if route.stall else len(route.content) + route.extra
                    self.send_header("Content-Length", str(length))
                    self.end_headers()
                    for byte in (route.content if route.gaps else [route.content]):
                        if route.gaps:
                            hostile.ended.wait(route.gaps)
                            byte = bytes([byte])
                        self.wfile.write(byte)
                        self.wfile.flush()
                        hostile.sent[self.path] += len(byte)
                    if route.stall:
                        hostile.ended.wait(600)
                    left, zeros = route.extra, bytes(MIB)
                    while left > 0:
                        self.wfile.write(zeros[:min(MIB, left)])
                        hostile.sent[self.path] += min(MIB, left)
                        left -= MIB
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                finally:
                    route.done.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.ended.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile():
    server = Hostile()
    try:
        yield server
    finally:
        server.close()


def wds_tar(labels: list[int]) -> bytes:
    """A WebDataset tar: ``k<i>.png`` (an 8x8 image) and ``k<i>.cls`` per label."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, label in enumerate(labels):
            png = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(png, format="PNG")
            for name, data in ((f"k{i}.png", png.getvalue()), (f"k{i}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# --- item 7: a download stops at its size -----------------------------------------------------------

def test_a_download_is_not_read_past_its_size(hostile, tmp_path):
    url = f"{hostile.url}/grow.tar"
    hostile.routes["/grow.tar"] = route = Route(head=1000, extra=256 * MIB)  # indexed at 1,000 bytes
    dest = tmp_path / "copy.tar"
    with pytest.raises(DataError) as err:
        remote.fetch(url, str(dest), 1000)
    assert str(err.value) == (f"shard {url}: the server sent more than the 1,000 bytes it said the file has (stopped "
                              f"after 1,001): the file changed on the server, or the server does not serve what it "
                              f"describes")  # was: every byte downloaded (550 MiB in 10 s), then a size mismatch
    assert route.done.wait(60)
    assert hostile.sent["/grow.tar"] < 64 * MIB  # the client hung up: socket buffers at most, not 256 MiB
    assert not dest.exists() and not Path(str(dest) + ".part").exists()


def test_the_index_build_downloads_no_more_than_each_shards_size(hostile):
    data = wds_tar([0, 1])
    hostile.routes["/wds/train-000000.tar"] = route = Route(head=len(data), content=data, extra=256 * MIB)
    url = f"{hostile.url}/wds/train-000000.tar"
    with pytest.raises(DataError, match=rf"^shard {url}: the server sent more than the {len(data):,} bytes"):
        load_shard_index([url], "webdataset")  # was: the tar and 256 MiB of zeros downloaded, then indexed
    assert route.done.wait(60)
    assert hostile.sent["/wds/train-000000.tar"] < 64 * MIB


# --- item 9: a remote manifest is read under a cap --------------------------------------------------

def test_a_remote_manifest_larger_than_the_cap_is_refused_without_reading_past_it(hostile, monkeypatch):
    monkeypatch.setattr(remote, "MANIFEST_BYTES", MIB, raising=False)
    body = b" " * (96 * MIB) + json.dumps({"classes": ["a", "b"]}).encode()
    hostile.routes["/big/manifest.json"] = Route(head=len(body), content=body)
    with pytest.raises(DataError) as err:  # was: 96 MiB read (1 GiB: 2 GiB of memory and 25 s), then used
        shards.manifest_classes([f"{hostile.url}/big/train-000000.tar"])
    url = f"{hostile.url}/big/manifest.json"
    assert str(err.value) == (f"manifest {url} is larger than the 1,048,576 bytes a manifest may have "
                              f"(remote.MANIFEST_BYTES); its server says {len(body):,} bytes")
    assert hostile.gets["/big/manifest.json"] == 0  # refused from its size: the body never asked for

    # a server that says 200 bytes and sends 96 MiB: refused after the cap, in both readers
    hostile.routes["/lying/manifest.json"] = route = Route(head=200, extra=96 * MIB)
    url = f"{hostile.url}/lying/manifest.json"
    for read in (lambda: shards.manifest_classes([f"{hostile.url}/lying/train-000000.tar"]),
                 lambda: layouts.remote_manifest(f"{hostile.url}/lying")):
        route.done.clear()
        with pytest.raises(DataError) as err:
            read()
        assert str(err.value) == (f"manifest {url} is larger than the 1,048,576 bytes a manifest may have "
                                  f"(remote.MANIFEST_BYTES); its server sent more than that (it said 200 bytes)")
        assert route.done.wait(60)
    assert hostile.sent["/lying/manifest.json"] < 2 * 48 * MIB  # two reads, each stopped near 1 MiB


# --- item 8: URL joins stay on the host -------------------------------------------------------------

@pytest.mark.parametrize("base", ["http://h:8", "http://h:8/", "http://h:8/data", "http://h:8/data/"])
def test_url_joins_never_leave_the_hosts_root(base):
    inside = base.rstrip("/").removeprefix("http://h:8")
    assert remote.join(base, "manifest.json") == f"http://h:8{inside}/manifest.json"
    assert remote.join(base, "train-{000000..000009}.tar") == f"http://h:8{inside}/train-{{000000..000009}}.tar"
    assert remote.join(base, "../manifest.json") == "http://h:8/manifest.json"  # at the root: stays there
    assert remote.join(base, "../../../x.tar") == "http://h:8/x.tar"
    assert remote.join(base, "/x.tar") == remote.join(base, "http://other/x.tar") == "http://h:8/x.tar"
    assert remote.join(base, "sub/") == f"http://h:8{inside}/sub/"
    assert remote.folder(remote.join(base, "a.tar")) == f"http://h:8{inside}/"


@pytest.mark.parametrize("server", ["http://h:8", "https://h", "s3://bucket"])
def test_the_manifest_of_shards_is_looked_up_on_their_host(server):
    assert shards.manifest_places(f"{server}/train-000000.tar") == [f"{server}/manifest.json"]  # was also
    # http://manifest.json (a host of that name: 3.9 s of retries) and s3://manifest.json (another bucket)
    assert shards.manifest_places(f"{server}/wds/train/x.tar") == [
        f"{server}/wds/train/manifest.json", f"{server}/wds/manifest.json"]
    assert shards.manifest_places("/train-000000.tar") == [Path("/manifest.json")]


@needs_nginx
def test_shards_at_a_servers_root_find_the_manifest_there(tmp_path):
    (tmp_path / "train-000000.tar").write_bytes(wds_tar([0, 1, 1]))
    (tmp_path / "manifest.json").write_text(json.dumps({"classes": ["cat", "dog"]}))
    with http_server(tmp_path, "manifest.json") as url:
        index = load_shard_index([f"{url}/train-000000.tar"], "webdataset")
    assert index.classes == ["cat", "dog"]
    assert list(index.labels) == [0, 1, 1]


# --- hypothesis a: timeouts between bytes, none on the whole transfer ----------------------------------

@pytest.mark.timeout(120)  # aiohttp's default (300 s for the whole response) fails here by this timeout
def test_a_stalled_body_fails_after_the_read_timeout_and_a_slow_steady_one_is_read(hostile, tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "READ_TIMEOUT", 1.5, raising=False)
    monkeypatch.setattr(remote, "ATTEMPTS", 1)
    monkeypatch.setattr(remote, "_FILESYSTEMS", {})  # filesystems made with this timeout
    slow = bytes(range(25))
    hostile.routes["/slow.tar"] = Route(head=len(slow), content=slow, gaps=0.1)  # 2.5 s in all, a byte each 0.1 s
    assert remote.fetch(f"{hostile.url}/slow.tar", str(tmp_path / "slow.tar"), len(slow)) == len(slow)
    assert (tmp_path / "slow.tar").read_bytes() == slow
    hostile.routes["/stall.tar"] = Route(head=100, content=b"0123456789", stall=True)
    url = f"{hostile.url}/stall.tar"
    with pytest.raises(remote.RemoteError) as err:
        remote.fetch(url, str(tmp_path / "stall.tar"), 100)
    assert str(err.value).startswith(f"shard {url} cannot be reached (downloading): the server sent nothing for 1.5 s "
                                     f"(remote.READ_TIMEOUT)")
    assert not (tmp_path / "stall.tar").exists()
