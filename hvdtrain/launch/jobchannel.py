"""The channel between :func:`hvdtrain.run`'s caller and its workers, one per job.

An HTTP endpoint on the one address the workers reach the caller at (never every interface):
workers ``GET /job`` (the pickled config and recipe) and ``PUT /result/RANK`` or
``PUT /failure/RANK`` (JSON data, never unpickled). Every request carries an HMAC-SHA256 of
method, path and body under the job's random key (else 403, nothing stored), and the job's
answer is signed too, so a worker unpickles only what the caller sent. Authenticated, not
encrypted: a host on the path can read the job.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
from typing import Any

def channel_address(hosts: str, network_interfaces: list[str] | None) -> str:
    """The address the job's channel listens on: the one the workers reach this machine at, never
    every interface. Loopback when every host is local; else the IPv4 address of the first of
    ``network_interfaces``, or the address this machine routes to the remote hosts from."""
    from hvdtrain.launch.hosts import is_local, parse_hosts

    remote = [name.rsplit("@", 1)[-1] for name, _ in parse_hosts(hosts) if not is_local(name)]
    if not remote:
        return "127.0.0.1"
    if network_interfaces:
        import psutil

        found = psutil.net_if_addrs()
        for nic in network_interfaces:
            for address in found.get(nic, []):
                if address.family == socket.AF_INET:
                    return address.address
        raise ValueError(f"network_interfaces={','.join(network_interfaces)!r}: no IPv4 address on this machine "
                         f"(interfaces here: {', '.join(sorted(found))})")
    sources = []
    for host in dict.fromkeys(remote):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((host, 9))  # no packet is sent: this only picks the route
                sources.append(probe.getsockname()[0])
        except OSError as e:
            from hvdtrain.launch.hosts import HostError

            raise HostError(f"host {host}: no IPv4 route from this machine to it ({e})") from None
    # a host that is this machine may route over loopback; the others need the outward address
    return next((source for source in sources if not source.startswith("127.")), sources[0])


def _digest(key: bytes, *parts: bytes) -> str:
    """HMAC-SHA256 of ``parts`` under ``key``, hex."""
    return hmac.new(key, b"\n".join(parts), hashlib.sha256).hexdigest()


class Channel:
    """The caller's end: serves ``job`` to signed requests, keeps the workers' results and failure
    reports (see the module docstring)."""

    MAX_BODY = 16 << 20

    def __init__(self, address: str, key: bytes, job: bytes):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self._key, self._job, self._lock = key, job, threading.Lock()
        self._reports: dict[int, dict[str, Any]] = {}
        self._results: dict[int, dict[str, Any]] = {}
        channel = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(b"")

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 <= length <= channel.MAX_BODY:
                    self._send(413)
                    return
                self._answer(self.rfile.read(length))

            def _answer(self, body: bytes) -> None:
                given = self.headers.get(AUTH_HEADER, "")
                wanted = _digest(channel._key, self.command.encode(), self.path.encode(), body)
                if not hmac.compare_digest(given, wanted):
                    self._send(403)
                    return
                self._send(*channel._handle(self.command, self.path, body))

            def _send(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                if body:
                    self.send_header(AUTH_HEADER, _digest(channel._key, b"answer", self.path.encode(), body))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((address, 0), Handler)
        self._server.daemon_threads = True
        self.address, self.port = address, self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True, name="hvdtrain-channel").start()

    def _handle(self, method: str, path: str, body: bytes) -> tuple[int] | tuple[int, bytes]:
        if method == "GET" and path == "/job":
            return 200, self._job
        kind, _, rank = path.strip("/").partition("/")
        if method != "PUT" or kind not in ("result", "failure") or not rank.isdigit():
            return (404,)
        try:
            data = json.loads(body)
            check_fields(data, RESULT_FIELDS if kind == "result" else REPORT_FIELDS)
        except ValueError:
            return (400,)
        with self._lock:
            (self._results if kind == "result" else self._reports)[int(rank)] = data
        return (200,)

    def reports(self) -> list[dict[str, Any]]:
        """The workers' failure reports received so far."""
        with self._lock:
            return list(self._reports.values())

    def result(self) -> dict[str, Any] | None:
        """Rank 0's result (:data:`RESULT_FIELDS`), if it arrived."""
        with self._lock:
            return self._results.get(0)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


AUTH_HEADER = "X-Hvdtrain-Auth"
REPORT_FIELDS = {"rank": int, "size": int, "host": str, "time": (int, float), "type": str, "module": str,
                 "message": str, "traceback": str}
RESULT_FIELDS = {"output": str, "history": list, "checkpoint": (str, type(None)), "world_size": int}


def check_fields(data: Any, fields: dict[str, Any]) -> None:
    """ValueError unless ``data`` is a JSON object with exactly these fields of these types."""
    if not isinstance(data, dict) or set(data) != set(fields) or \
            not all(isinstance(data[k], t) and not isinstance(data[k], bool) for k, t in fields.items()):
        raise ValueError("not a report")


def request(address: str, port: int, key: bytes, method: str, path: str, body: bytes = b"") -> bytes:
    """One authenticated request to the caller's channel; a GET's answer is checked against the key."""
    import urllib.request

    request = urllib.request.Request(f"http://{address}:{port}{path}", data=body if method == "PUT" else None,
                                     method=method, headers={AUTH_HEADER: _digest(key, method.encode(),
                                                                                  path.encode(), body)})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = response.read()
        if method == "GET" and not hmac.compare_digest(response.headers.get(AUTH_HEADER, ""),
                                                       _digest(key, b"answer", path.encode(), answer)):
            raise RuntimeError(f"the answer from {address}:{port} is not signed with this job's key")
    return answer
