"""Shards named by URL (``https://host/train-{000000..000009}.tar``, ``s3://...``) read through fsspec.

A *location* is a local path or a URL; :func:`is_url` tells them apart (``file://`` counts as
local). Remote files are reached through ``fsspec`` (its HTTP backend needs ``aiohttp``; ``s3://``
and others need the user's fsspec backend, such as ``s3fs``), one filesystem object per process
and protocol. What this module offers is the little the shard code needs: expand a pattern into
URLs (:func:`expand`: braces always, globs where the backend can list), a file's size and version
tag for the index's cache key (:func:`stat`), a byte range (:func:`read_range`: one range request),
a seekable file for Parquet (:func:`open_file`), a whole-file copy to a local path
(:func:`fetch`: written to ``PATH.part``, never past the size it is given, checked against it,
renamed into place), a small file read whole under a cap (:func:`read_small`: a ``manifest.json``)
and URL joins that stay on the URL's host (:func:`join`, :func:`folder`). HTTP(S) reads have a
connect timeout and a timeout between two received bytes (:data:`CONNECT_TIMEOUT`,
:data:`READ_TIMEOUT`), none on a whole transfer. Errors name the URL.
"""

from __future__ import annotations

import os
import posixpath
import sys
import threading
import time
from urllib.parse import urlsplit, urlunsplit

from hvdtrain.core.redact import redact_text
from hvdtrain.data import braces
from hvdtrain.data.errors import DataError

FETCH_CHUNK = 4 << 20
READ_MODES = ("auto", "random", "stream")  # image.read: random access, streaming (stream.py), auto: stream remote shards
ATTEMPTS = 3  # a read or download that fails is tried this often (1 s, 2 s apart) before it is an error
MANIFEST_BYTES = 64 << 20  # a manifest.json read from a server: one larger is refused (not read past this)
CONNECT_TIMEOUT = 30.0  # HTTP(S): seconds to open a connection (per attempt)
READ_TIMEOUT = 60.0  # HTTP(S): seconds a server may send nothing mid-response; a whole download has no bound
_FILESYSTEMS: dict[str, object] = {}
_LOCK = threading.Lock()


class RemoteError(RuntimeError):
    """A remote read failed (after :data:`ATTEMPTS` tries): never taken for an undecodable image."""


class _Local(Exception):
    """A local file's OSError inside a download (carried past the retries of network failures)."""


def is_url(location: str | os.PathLike) -> bool:
    """True for ``scheme://...`` other than ``file://`` (a local path otherwise)."""
    text = os.fspath(location)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme.lower() not in ("file", "local")


def local_path(location: str) -> str:
    """A local location without its ``file://`` prefix."""
    return location[len("file://"):] if location.startswith("file://") else location


def filesystem(url: str):
    """This process's fsspec filesystem for ``url``'s protocol (created once)."""
    protocol = url.partition("://")[0].lower()
    with _LOCK:
        fs = _FILESYSTEMS.get(protocol)
        if fs is None:
            try:
                import fsspec
            except ImportError:
                raise DataError(f"{url}: remote shards need fsspec (and aiohttp for http/https): "
                                f"pip install 'hvdtrain[data]'") from None
            try:
                fs = fsspec.filesystem(protocol, **_options(protocol))
            except (ImportError, ValueError) as exc:
                raise DataError(f"{url}: no fsspec backend for {protocol}:// ({exc})") from None
            _FILESYSTEMS[protocol] = fs
        return fs


def _options(protocol: str) -> dict:
    """The fsspec options of ``protocol``'s filesystem: for HTTP(S), aiohttp's timeouts replaced by
    :data:`CONNECT_TIMEOUT` and :data:`READ_TIMEOUT` (aiohttp's default of 300 s for the whole
    response failed every download longer than that, however steadily it arrived)."""
    if protocol not in ("http", "https"):
        return {}
    try:
        import aiohttp
    except ImportError:
        return {}  # fsspec names what is missing
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
    return {"client_kwargs": {"timeout": timeout}}


def _not_found(exc: BaseException) -> bool:
    """True if ``exc`` says the file does not exist (fsspec's HTTP backend raises FileNotFoundError
    for any failure: the cause tells a 404 from a refused connection)."""
    if not isinstance(exc, FileNotFoundError):
        return False
    cause = exc.__cause__ or exc.__context__
    return cause is None or isinstance(cause, FileNotFoundError) or getattr(cause, "status", None) in (404, 410)


def _error(url: str, exc: BaseException, doing: str) -> Exception:
    """What a failed remote call raises: DataError when the file does not exist or the server
    refuses it (bad input, named), RemoteError for a transport failure."""
    if _not_found(exc):
        return DataError(f"shard {url} does not exist (the server answered not found while {doing})")
    cause = exc.__cause__ or exc.__context__ if isinstance(exc, FileNotFoundError) else exc
    status = getattr(cause, "status", None)
    if status is not None:
        return DataError(f"shard {url}: the server answered {status} while {doing} ({cause})")
    if isinstance(cause, TimeoutError) or type(cause).__name__ == "ServerTimeoutError":
        return RemoteError(f"shard {url} cannot be reached ({doing}): the server sent nothing for "
                           f"{READ_TIMEOUT:g} s (remote.READ_TIMEOUT) or did not connect within {CONNECT_TIMEOUT:g} s "
                           f"({type(cause).__name__})")
    return RemoteError(f"shard {url} cannot be reached ({doing}): {type(cause).__name__}: {cause}")


def _retried(url: str, doing: str, call, reading: bool = False, first: bool = False):
    """``call()``, tried :data:`ATTEMPTS` times (a file that does not exist: once). ``reading``: a
    sample's read, whose every failure is a :class:`RemoteError` (never taken for a bad image);
    ``first``: the first contact with the URL, where a server that cannot be reached is bad input
    (a DataError naming it).

    A loop of its own rather than a retry library (checked 2026-11-28): urllib3's ``Retry`` does not
    apply (fsspec reaches HTTP through aiohttp, S3 through botocore), and ``tenacity``, which is not
    installed, would replace only the loop and the sleep (about 5 of these 19 lines): what to retry
    (not a missing file, not a local disk's error) and which error a last failure becomes (a
    sample's read, a first contact) stay here, for one more dependency."""
    for attempt in range(ATTEMPTS):
        try:
            return call()
        except (DataError, InterruptedError, _Local):
            raise
        except Exception as exc:  # noqa: BLE001  (aiohttp/botocore errors have no common base)
            if attempt == ATTEMPTS - 1 or _not_found(exc):
                error = _error(url, exc, doing)
                if reading:
                    error = RemoteError(str(error))
                elif first:
                    error = DataError(str(error))
                raise error from None
            time.sleep(2 ** attempt)


def join(root: str, relative: str) -> str:
    """``relative`` under ``root`` (a URL or a local folder). For a URL, ``root`` is a folder (with
    or without its trailing slash) and the result never leaves its host: ``..`` stops at the
    server's root and an absolute ``relative`` (``/x``, ``http://other/x``) is a path on that host,
    the way :func:`urllib.parse.urljoin` resolves against ``root + "/"`` minus other hosts."""
    if not is_url(root):
        return os.path.join(root, relative)
    scheme, host, path, _, _ = urlsplit(root)
    rel = "/" + relative.partition("://")[2].partition("/")[2] if "://" in relative else relative
    joined = posixpath.normpath(posixpath.join("/" + path.strip("/"), rel)) if rel else "/" + path.strip("/")
    joined = "/" + joined.lstrip("/")  # normpath keeps a leading "//"
    if rel.endswith("/") and not joined.endswith("/"):
        joined += "/"
    return urlunsplit((scheme, host, joined, "", ""))


def folder(location: str) -> str:
    """The folder holding ``location`` (a URL: its path up to the last slash, at least the server's
    root ``scheme://host/``; a local path: its parent)."""
    if not is_url(location):
        return os.path.dirname(location)
    scheme, host, path, _, _ = urlsplit(location)
    return urlunsplit((scheme, host, path.rpartition("/")[0] + "/", "", ""))


def common_root(locations: list[str]) -> str:
    """The deepest folder (URL or local) holding every location."""
    if all(is_url(x) for x in locations):
        folders = [posixpath.dirname(x) for x in locations]
        root = posixpath.commonpath([f.partition("://")[2] for f in folders])
        scheme = {f.partition("://")[0] for f in folders}
        if len(scheme) != 1 or not root:
            raise DataError(f"shards {locations[0]} ... are not on one server; give one split's shards "
                            f"from one place")
        return f"{scheme.pop()}://{root}"
    if any(is_url(x) for x in locations):
        raise DataError(f"shards mix URLs and local files ({locations[0]} ...); give one kind")
    return os.path.commonpath([os.path.dirname(os.path.abspath(x)) for x in locations])


def relative(root: str, location: str) -> str:
    """``location`` relative to :func:`common_root`'s ``root``."""
    if is_url(root):
        return location[len(root.rstrip("/")) + 1:]
    return os.path.relpath(location, root)


def expand(pattern: str, extensions: tuple[str, ...] = ()) -> list[str]:
    """The URLs ``pattern`` names: braces expanded; a glob (``*``, ``?``, ``[``) listed where the
    backend can list (plain HTTP servers mostly cannot: use a brace pattern there); a folder URL
    (ending in ``/``) gives its files ending in ``extensions``."""
    urls: list[str] = []
    for name in braces.expand(pattern):
        if name.endswith("/") or any(c in name.partition("://")[2] for c in braces.GLOB_CHARS):
            fs = filesystem(name)
            try:
                if name.endswith("/"):
                    found = sorted(p for p in fs.ls(name, detail=False) if p.lower().endswith(extensions))
                else:
                    found = sorted(fs.glob(name))
            except (OSError, ValueError) as exc:
                raise _error(name, exc, "listing") from None
            if not found:
                raise DataError(f"{name} (from {pattern}) lists no files{' ending in ' + ', '.join(extensions) if extensions else ''}; "
                                f"a plain HTTP server cannot be listed: name the shards with a brace pattern "
                                f"such as train-{{000000..000099}}.tar")
            protocol = name.partition("://")[0]
            urls += [p if "://" in p else f"{protocol}://{p}" for p in found]
        else:
            urls.append(name)
    return urls


def stat(url: str) -> tuple[int, str]:
    """``(size, version)`` of a remote file: the version is its ETag or modification time (what
    the server says), so a changed file changes the index's cache key."""
    info = _retried(url, "asking its size", lambda: filesystem(url).info(url), first=True)
    size = info.get("size")
    if size is None:
        raise DataError(f"shard {url}: the server does not say its size (no Content-Length); random access and "
                        f"streaming need it")
    version = next((str(info[k]) for k in ("ETag", "etag", "Last-Modified", "LastModified", "mtime", "last_modified")
                    if info.get(k) is not None), "")
    return int(size), version


def read_range(url: str, offset: int, length: int) -> bytes:
    """Bytes ``[offset, offset + length)`` of ``url`` (one range request)."""
    doing = f"reading bytes {offset:,}-{offset + length:,}"
    data = _retried(url, doing, lambda: filesystem(url).cat_file(url, start=offset, end=offset + length), True)
    if len(data) > length and len(data) >= offset + length:  # a 200 with the whole file: Range ignored
        _warn_once(url.partition("://")[2].partition("/")[0],
                   f"hvdtrain: the server of {url} ignores HTTP range requests (it sends whole files): every "
                   f"sample read at random downloads its whole shard. Serve the shards with range requests "
                   f"(nginx: scripts/http-server.sh ROOT PORT) or stream them (image.read=stream)")
        data = data[offset:offset + length]
    return data


_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    """Print ``message`` on stderr once per process and ``key``."""
    if key not in _WARNED:
        _WARNED.add(key)
        print(redact_text(message), file=sys.stderr, flush=True)  # a URL's secrets: never shown


def open_file(url: str, reading: bool = False):
    """A seekable binary file of ``url`` (range requests as it is read; for Parquet footers and row
    groups); ``reading``: a sample's read (failures are :class:`RemoteError`)."""
    return _retried(url, "opening", lambda: filesystem(url).open(url, "rb", block_size=FETCH_CHUNK), reading)


def _stream(url: str, write, limit: int, stop: threading.Event | None = None) -> int:
    """One streamed GET of ``url``, each chunk given to ``write``, never more than ``limit`` bytes
    read (a server that sends more is detected by the one byte past it): returns the bytes read."""
    read = 0
    with filesystem(url).open(url, "rb", block_size=0) as src:
        while True:
            if stop is not None and stop.is_set():
                raise InterruptedError(f"download of {url} stopped")
            chunk = src.read(min(FETCH_CHUNK, limit - read))
            if not chunk:
                return read
            write(chunk)
            read += len(chunk)
            if read >= limit:
                return read


def fetch(url: str, dest: str, size: int, stop: threading.Event | None = None,
          part: str | None = None) -> int:
    """Copy ``url`` whole to ``dest`` (through ``part``, default ``dest.part``, renamed when
    complete and of the expected ``size``); returns the bytes written. At most ``size + 1`` bytes
    are read: a server sending more (the file grew, or it sends without end) is refused naming the
    URL and both sizes. ``stop`` set: give up (InterruptedError, the part file removed)."""
    part = part or dest + ".part"

    def copy() -> int:
        try:
            out = open(part, "wb")
        except OSError as exc:
            raise _Local(exc) from None

        def write(chunk: bytes) -> None:
            try:
                out.write(chunk)
            except OSError as exc:
                raise _Local(exc) from None

        with out:
            return _stream(url, write, size + 1, stop)

    try:
        written = _retried(url, "downloading", copy)
    except _Local as local:
        _remove(part)
        raise local.args[0] from None  # the local disk's error (full, read-only), not the server's
    except BaseException:
        _remove(part)
        raise
    if written > size:
        _remove(part)
        raise DataError(f"shard {url}: the server sent more than the {size:,} bytes it said the file has (stopped "
                        f"after {written:,}): the file changed on the server, or the server does not serve what it "
                        f"describes")
    if written != size:
        _remove(part)
        raise DataError(f"shard {url}: downloaded {written:,} bytes, the index recorded {size:,} (the file changed "
                        f"on the server or the transfer was cut short)")
    os.replace(part, dest)
    return written


def read_small(url: str, what: str, cap: int | None = None) -> bytes | None:
    """The whole of a small file ``url`` such as a ``manifest.json`` (None if the server has none):
    refused in one DataError naming ``what``, the URL and the cap (default :data:`MANIFEST_BYTES`)
    when its size says it is larger, or when more than the cap arrives (never read past it)."""
    cap = MANIFEST_BYTES if cap is None else cap
    try:
        size, _ = stat(url)
    except DataError:
        return None  # not found (or not reachable: the shards' own reads name the server)
    too_large = (f"{what} {url} is larger than the {cap:,} bytes a {what} may have (remote.MANIFEST_BYTES); "
                 f"its server")
    if size > cap:
        raise DataError(f"{too_large} says {size:,} bytes")
    parts: list[bytes] = []

    def read() -> int:
        parts.clear()
        return _stream(url, parts.append, cap + 1)

    if _retried(url, f"reading the {what}", read) > cap:
        raise DataError(f"{too_large} sent more than that (it said {size:,} bytes)")
    return b"".join(parts)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
