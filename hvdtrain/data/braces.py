"""Shard lists as users write them: brace patterns (``train-{000000..001023}.tar``, ``{a,b}``), globs, folders.

:func:`expand` expands braces (numeric ranges keep the zero padding of their bounds; comma lists;
several groups and nesting multiply out, in order). :func:`resolve` turns a pattern into the
existing files it names: a folder gives its files with the wanted extensions, a brace pattern
gives every expansion (each must exist, or be a glob matching something), anything else is a glob.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?$")
GLOB_CHARS = ("*", "?", "[")


def _closing(text: str, start: int) -> int:
    """Index of the ``}`` matching the ``{`` at ``start``, or -1."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_top(body: str) -> list[str]:
    """``body`` split at the commas that are not inside nested braces."""
    parts, depth, current = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        current += ch
    return parts + [current]


def _alternatives(body: str) -> list[str] | None:
    """What one brace group stands for, or None if it is not one (``{}``, ``{x}``: kept literally)."""
    match = RANGE.match(body)
    if match:
        first, last, step = match.group(1), match.group(2), int(match.group(3) or 1)
        width = max(len(first), len(last)) if (first.lstrip("-").startswith("0") and len(first.lstrip("-")) > 1) or \
            (last.lstrip("-").startswith("0") and len(last.lstrip("-")) > 1) else 0
        lo, hi = int(first), int(last)
        numbers = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [str(n).zfill(width) for n in numbers]
    parts = _split_top(body)
    if len(parts) < 2:
        return None
    return [item for part in parts for item in expand(part)]


def expand(pattern: str) -> list[str]:
    """Every string ``pattern``'s braces stand for, in order: ``a-{1..3}`` -> a-1, a-2, a-3;
    ``{000..002}`` -> 000, 001, 002; ``{x,y}-{0..1}`` -> x-0, x-1, y-0, y-1."""
    start = pattern.find("{")
    while start >= 0:
        end = _closing(pattern, start)
        if end < 0:
            return [pattern]
        options = _alternatives(pattern[start + 1:end])
        if options is not None:
            head, tails = pattern[:start], expand(pattern[end + 1:])
            return [head + option + tail for option in options for tail in tails]
        start = pattern.find("{", end + 1)
    return [pattern]


def resolve(pattern: str | Path, base: str | Path | None = None, extensions: tuple[str, ...] = ()) -> list[Path]:
    """The files ``pattern`` names (relative patterns: under ``base``); a folder gives its files
    ending in ``extensions`` (sorted). Raises FileNotFoundError with a one-line reason naming the
    pattern and what is there instead."""
    text = os.fspath(pattern)
    if base is not None and not os.path.isabs(text):
        text = os.path.join(os.fspath(base), text)
    if os.path.isdir(text):
        found = sorted(p for p in Path(text).iterdir() if p.is_file() and p.name.lower().endswith(extensions)
                       and not p.name.startswith("."))
        if not found:
            raise FileNotFoundError(f"folder {text} holds no files ending in {', '.join(extensions)}; it holds: "
                                    f"{listing(text)}")
        return found
    files: list[Path] = []
    for name in expand(text):
        if any(c in name for c in GLOB_CHARS):
            matched = sorted(glob.glob(name))
            if not matched:
                raise FileNotFoundError(f"no file matches {name} (from {os.fspath(pattern)}); "
                                        f"{os.path.dirname(name) or '.'} holds: {listing(os.path.dirname(name))}")
            files += [Path(m) for m in matched if os.path.isfile(m)]
        elif os.path.isfile(name):
            files.append(Path(name))
        else:
            raise FileNotFoundError(f"shard {name} (from {os.fspath(pattern)}) does not exist; "
                                    f"{os.path.dirname(name) or '.'} holds: {listing(os.path.dirname(name))}")
    if not files:
        raise FileNotFoundError(f"{os.fspath(pattern)} names no files")
    return files


def listing(folder: str, most: int = 8) -> str:
    """A short listing of ``folder`` for error messages ("a, b, c and 5 more")."""
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return "nothing (no such folder)"
    if not names:
        return "nothing"
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
