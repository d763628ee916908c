"""Secrets in URIs never leave memory: what hvdtrain saves, logs or shows holds a redacted copy.

Users put credentials in URIs: ``log.mlflow_tracking_uri=http://user:password@host`` (or
``MLFLOW_TRACKING_URI``), ``--data https://user:token@host/shards/``, signed shard URLs
(``?X-Amz-Signature=...``, ``?token=...``). The real value stays in the config in memory (it is
what connects); every writer (``config.yaml``, a checkpoint's ``manifest.json``, the tracker runs'
parameters and tags, a conversion's manifest, the index cache) and every line shown (errors,
warnings, progress) goes through :func:`redact_text` or :func:`redact_values`, which replace the
user-info part of a URI and the value of every query parameter with ``***``.

Imports nothing from hvdtrain.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
# scheme://[userinfo@]rest, up to whitespace, a quote, '<', '>' or a parenthesis (brace patterns stay inside)
_URI = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{1,30})://([^\s'\"<>()]*)")


def _redact_one(scheme: str, rest: str) -> str:
    authority_end = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if at != -1:
            authority_end = min(authority_end, at)
    authority, tail = rest[:authority_end], rest[authority_end:]
    if "@" in authority:
        authority = MASK + "@" + authority.rsplit("@", 1)[1]
    query_at = tail.find("?")
    if query_at != -1:
        path, query = tail[:query_at], tail[query_at + 1:]
        fragment = ""
        if "#" in query:
            query, fragment = query.split("#", 1)
            fragment = "#" + fragment
        parts = [(p.split("=", 1)[0] + "=" + MASK) if "=" in p else p for p in query.split("&")]
        tail = path + "?" + "&".join(parts) + fragment
    return f"{scheme}://{authority}{tail}"


def redact_uri(uri: str) -> str:
    """``uri`` with its user-info (``user:password@``) and query-parameter values replaced by
    ``***``; anything that is not a URI is returned unchanged."""
    return redact_text(uri)


def redact_text(text: str) -> str:
    """``text`` (an error line, a log line, a value) with every URI in it redacted (:func:`redact_uri`)."""
    if "://" not in text:
        return text
    return _URI.sub(lambda m: _redact_one(m.group(1), m.group(2)), text)


def redact_values(value: Any) -> Any:
    """A copy of ``value`` (a config as a dict, a record) with every string in it redacted;
    mapping keys are kept."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_values(v) for v in value)
    return value
