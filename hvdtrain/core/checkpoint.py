"""Rank-0 checkpoints: one folder per checkpoint, written atomically, with a manifest.

Layout::

    OUTPUT/checkpoints/epoch-0002/
        manifest.json      format version, recipe, framework, epoch, step, world size, config,
                           versions, and the SHA-256 of every payload file
        <payload files>    framework-native (model.pt / optimizer.pt, model_variables.npz / optimizer.npz)

A checkpoint is first written under ``.tmp-<name>-<pid>``, every file is flushed and fsynced,
then the folder is renamed into place and the parent directory fsynced; a crash at any point
leaves the previous checkpoint untouched and usable. Only folders with a manifest whose
checksums match count as checkpoints. Existing checkpoints are never overwritten.

Checkpoints are ordered by training progress, the position in the data (completed epochs, then
samples of the next epoch's order consumed), which means the same for any number of workers;
"latest" and pruning follow that order, so a resume on another world size never makes an older
checkpoint look newer. Step checkpoints are named by the optimizer updates taken, a count that is
carried across resumes and only grows, so names never repeat.

:meth:`CheckpointManager.latest` is the one place that finds the checkpoint a resume uses: the
newest whose payload matches its checksums, reporting each newer damaged one it skipped;
:meth:`CheckpointManager.set_aside` then moves those out of the way (kept, never deleted).

A manifest is data from disk, not trusted: every file name it lists must be a plain name inside
the folder (no absolute path, no separator, no ``..``), every file in the folder must be listed
(the loaders read fixed names: an unlisted ``model.pt`` would load unchecked), and a manifest that
is malformed (wrong types, missing keys) makes its checkpoint damaged, named by its folder, never
a crash of every later start. :meth:`CheckpointManager.open` reads one named checkpoint and fails
with a one-line :class:`CheckpointError` naming the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hvdtrain.core import faults
from hvdtrain.core.durable import atomic_write_text, fsync_path

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# what a crashed writer or an interrupted prune leaves (removed at the next start, rank 0)
LEFTOVER_PREFIXES = (".tmp-", ".trash-")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, read, or does not fit this run."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint on disk and its manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def epoch(self) -> int:
        """Epochs completed when it was written."""
        return int(self.manifest["epoch"])

    @property
    def step(self) -> int:
        """Optimizer steps completed when it was written."""
        return int(self.manifest["step"])

    @property
    def consumed(self) -> int:
        """Samples of epoch ``epoch + 1``'s order consumed when it was written (0 at an epoch end)."""
        return int(self.manifest.get("consumed", 0))

    @property
    def progress(self) -> tuple[int, int, int]:
        """The sort key: position in the data (epoch, consumed), then the step count."""
        return self.epoch, self.consumed, self.step


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def safe_file_name(name: Any) -> bool:
    """True if ``name`` is a plain file name inside a checkpoint folder: a non-empty string without
    a path separator, not ``.``/``..``, not absolute, not the manifest, no NUL."""
    return (isinstance(name, str) and name not in ("", ".", "..", MANIFEST) and "/" not in name
            and "\\" not in name and "\0" not in name and not os.path.isabs(name))


def manifest_problem(manifest: Any) -> str | None:
    """Why ``manifest`` (parsed JSON) is malformed, or None: it must be an object whose ``files``
    maps plain file names (:func:`safe_file_name`) to SHA-256 hex digests, and whose ``epoch``,
    ``step`` (and ``consumed``, when present) are counts."""
    if not isinstance(manifest, dict):
        return f"{MANIFEST} is not a JSON object"
    for key in ("epoch", "step", "files"):
        if key not in manifest:
            return f"{MANIFEST} has no {key!r}"
    for key in ("epoch", "step", "consumed"):
        if key in manifest and not _is_count(manifest[key]):
            return f"{MANIFEST}: {key!r} is {manifest[key]!r}, not a non-negative integer"
    files = manifest["files"]
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST}: 'files' must list the checkpoint's files with their SHA-256, got {files!r}"[:300]
    for name, digest in files.items():
        if not safe_file_name(name):
            return f"{MANIFEST} lists file name {name!r}, which is not a plain name inside the folder"
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            return f"{MANIFEST}: file {name}'s SHA-256 {digest!r} is not 64 hex digits"[:300]
    return None


class CheckpointManager:
    """Writes (on rank 0) and finds checkpoints under ``directory``."""

    def __init__(self, directory: str | Path, keep_last: int = 3, best_metric: str | None = None,
                 best_mode: str = "max"):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.required: tuple[str, ...] = ()  # files every checkpoint must hold (what the loader reads)
        self.framework: str | None = None  # whose loader ``required`` describes
        self.extra: dict[str, Any] = {}  # entries every manifest it writes also holds (over the caller's)

    def checkpoints(self, problems: list[str] | None = None,
                    malformed: list[CheckpointInfo] | None = None) -> list[CheckpointInfo]:
        """Valid checkpoints, oldest first by training progress (partial folders, without a
        manifest, are skipped). A folder whose manifest is malformed is skipped too: described in
        ``problems`` and appended to ``malformed`` (when given)."""
        found = []
        if self.directory.is_dir():
            for child in sorted(self.directory.iterdir()):
                if child.name.startswith(".") or not child.is_dir():
                    continue
                try:
                    manifest = self.load_manifest(child)
                except CheckpointError as exc:
                    if problems is not None:
                        problems.append(f"{exc}; skipped")
                    if malformed is not None:
                        malformed.append(CheckpointInfo(child, {}))
                    continue
                if manifest is not None:
                    found.append(CheckpointInfo(child, manifest))
        return sorted(found, key=lambda c: c.progress)

    def latest(self, problems: list[str] | None = None,
               damaged: list[CheckpointInfo] | None = None) -> CheckpointInfo | None:
        """The newest checkpoint whose files match their checksums, or None. Each newer checkpoint
        that fails verification, and every checkpoint whose manifest is malformed, is skipped:
        described in ``problems`` and appended to ``damaged`` (when given), for :meth:`set_aside`."""
        malformed: list[CheckpointInfo] = []
        found = self.checkpoints(problems, malformed)
        if damaged is not None:
            damaged.extend(malformed)
        for info in reversed(found):
            problem = self.verify(info.path, info.manifest, self.required_for(info.manifest))
            if problem is None:
                return info
            if problems is not None:
                problems.append(problem)
            if damaged is not None:
                damaged.append(info)
        return None

    def required_for(self, manifest: dict[str, Any]) -> tuple[str, ...]:
        """The files this run's loader reads from the checkpoint of ``manifest``: none from another
        framework's checkpoint (resume planning refuses that one naming both frameworks; it is not
        damaged)."""
        return self.required if manifest.get("framework", self.framework) == self.framework else ()

    def set_aside(self, damaged: list[CheckpointInfo]) -> list[str]:
        """:meth:`quarantine` each checkpoint :meth:`latest` found damaged, out of the way of the
        checkpoints a run will write; returns one line per checkpoint saying where it went."""
        return [f"moved damaged checkpoint {info.path.name} aside to {self.quarantine(info).name}"
                for info in damaged]

    @staticmethod
    def verify(path: Path, manifest: dict[str, Any], required: tuple[str, ...] = ()) -> str | None:
        """None if the manifest is well formed, lists every file of the folder and every name in
        ``required`` (the files the loader reads), and each listed file matches its SHA-256; else a
        one-line message naming the folder and the bad file."""
        problem = manifest_problem(manifest)
        if problem is not None:
            return f"checkpoint {path}: {problem}; skipped"
        if manifest.get("format_version") != FORMAT_VERSION:
            return (f"checkpoint {path}: format version {manifest.get('format_version')!r} is not "
                    f"{FORMAT_VERSION}; skipped")
        files = manifest["files"]
        try:
            unlisted = sorted(child.name for child in Path(path).iterdir()
                              if child.name != MANIFEST and child.name not in files)
        except OSError as exc:
            return f"checkpoint {path}: cannot list the folder ({exc}); skipped"
        if unlisted:
            return (f"checkpoint {path}: file {unlisted[0]} is not listed in its {MANIFEST} "
                    f"(every file of a checkpoint must be checksummed); skipped")
        for name in required:
            if name not in files:
                return f"checkpoint {path}: file {name} is missing from the folder and its {MANIFEST}; skipped"
        for name, digest in files.items():
            if not (path / name).is_file():
                return f"checkpoint {path}: file {name} is missing; skipped"
            if sha256_file(path / name) != digest:
                return f"checkpoint {path}: file {name} does not match its SHA-256 (corrupted or truncated); skipped"
        return None

    @staticmethod
    def load_manifest(path: Path) -> dict[str, Any] | None:
        """The manifest of the checkpoint folder ``path``: None if it has none (a foreign or partial
        folder); raises :class:`CheckpointError` naming the folder if it is unreadable or malformed."""
        file = Path(path) / MANIFEST
        if not file.exists():
            return None
        try:
            manifest = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {path}: {MANIFEST} is not readable JSON ({exc})") from None
        problem = manifest_problem(manifest)
        if problem is not None:
            raise CheckpointError(f"checkpoint {path}: {problem}")
        return manifest

    @staticmethod
    def read(path: Path, verify: bool = True) -> CheckpointInfo | None:
        """The checkpoint at ``path`` if its manifest is readable and well formed (and, with
        ``verify``, its payload checksums match); None otherwise."""
        try:
            manifest = CheckpointManager.load_manifest(path)
        except CheckpointError:
            return None
        if manifest is None:
            return None
        if verify and CheckpointManager.verify(path, manifest) is not None:
            return None
        return CheckpointInfo(path, manifest)

    @staticmethod
    def open(path: str | Path, required: tuple[str, ...] = ()) -> CheckpointInfo:
        """The checkpoint at ``path``, verified (holding every file in ``required``); a missing,
        malformed or damaged one raises a one-line :class:`CheckpointError` naming the folder (an
        explicit resume from it)."""
        path = Path(path)
        manifest = CheckpointManager.load_manifest(path)
        if manifest is None:
            raise CheckpointError(f"checkpoint {path}: no {MANIFEST} (not a checkpoint folder)")
        problem = CheckpointManager.verify(path, manifest, required)
        if problem is not None:
            raise CheckpointError(problem.removesuffix("; skipped"))
        return CheckpointInfo(path, manifest)

    def save(self, name: str, write_payload: Callable[[Path], None], manifest: dict[str, Any]) -> CheckpointInfo:
        """Write checkpoint ``name``: ``write_payload(tmpdir)`` writes the files, then the manifest
        with their checksums (and :attr:`extra`), fsync, rename into place, and prune old checkpoints."""
        final = self.directory / name
        if final.exists():
            raise CheckpointError(f"checkpoint {final} already exists; refusing to overwrite it")
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".tmp-{name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            write_payload(tmp)
            files = {}
            for child in sorted(tmp.iterdir()):
                if child.is_file():
                    fsync_path(child)
                    files[child.name] = sha256_file(child)
            manifest = {**manifest, **self.extra, "format_version": FORMAT_VERSION, "files": files}
            atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
            fsync_path(tmp)
            faults.crash_before_publish(int(manifest["step"]))
            os.rename(tmp, final)
            fsync_path(self.directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()
        return CheckpointInfo(final, manifest)

    def quarantine(self, info: CheckpointInfo) -> Path:
        """Move a checkpoint that failed verification aside (kept for inspection, never deleted)."""
        target = info.path.with_name(f".corrupt-{info.path.name}-{int(time.time())}")
        os.rename(info.path, target)
        return target

    def remove_temporaries(self) -> list[str]:
        """Delete half-written ``.tmp-*`` folders a crashed writer left and ``.trash-*`` folders a
        prune killed mid-delete left (rank 0, before training); returns the names removed."""
        removed = []
        if self.directory.is_dir():
            for child in sorted(self.directory.iterdir()):
                if not child.name.startswith(LEFTOVER_PREFIXES):
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
                removed.append(child.name)
        return removed

    def best(self) -> CheckpointInfo | None:
        """The checkpoint with the best ``best_metric`` in its manifest's metrics, if any."""
        scored = [c for c in self.checkpoints()
                  if self.best_metric and isinstance(c.manifest.get("metrics"), dict)
                  and isinstance(c.manifest["metrics"].get(self.best_metric), (int, float))]
        if not scored:
            return None
        pick = max if self.best_mode == "max" else min
        return pick(scored, key=lambda c: c.manifest["metrics"][self.best_metric])

    def prune(self) -> None:
        """Delete all but the newest ``keep_last`` checkpoints and the best one."""
        best = self.best()
        for info in self.checkpoints()[:-self.keep_last]:
            if best is not None and info.path == best.path:
                continue
            trash = info.path.with_name(f".trash-{info.path.name}-{os.getpid()}")
            os.rename(info.path, trash)
            shutil.rmtree(trash, ignore_errors=True)
