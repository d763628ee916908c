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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hvdtrain.core import faults

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


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


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync, and rename."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)


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

    def checkpoints(self) -> list[CheckpointInfo]:
        """Valid checkpoints, oldest first by training progress (invalid or partial folders are skipped)."""
        found = []
        if self.directory.is_dir():
            for child in self.directory.iterdir():
                if child.name.startswith(".") or not child.is_dir():
                    continue
                info = self.read(child, verify=False)
                if info is not None:
                    found.append(info)
        return sorted(found, key=lambda c: c.progress)

    def latest(self, problems: list[str] | None = None,
               damaged: list[CheckpointInfo] | None = None) -> CheckpointInfo | None:
        """The newest checkpoint whose files match their checksums, or None. Each newer checkpoint
        that fails verification is skipped: described in ``problems`` and appended to ``damaged``
        (when given), newest first, for :meth:`set_aside`."""
        for info in reversed(self.checkpoints()):
            problem = self.verify(info.path, info.manifest)
            if problem is None:
                return info
            if problems is not None:
                problems.append(problem)
            if damaged is not None:
                damaged.append(info)
        return None

    def set_aside(self, damaged: list[CheckpointInfo]) -> list[str]:
        """:meth:`quarantine` each checkpoint :meth:`latest` found damaged, out of the way of the
        checkpoints a run will write; returns one line per checkpoint saying where it went."""
        return [f"moved damaged checkpoint {info.path.name} aside to {self.quarantine(info).name}"
                for info in damaged]

    @staticmethod
    def verify(path: Path, manifest: dict[str, Any]) -> str | None:
        """None if every payload file matches its SHA-256, else a message naming the bad file."""
        if manifest.get("format_version") != FORMAT_VERSION:
            return (f"checkpoint {path}: format version {manifest.get('format_version')!r} is not "
                    f"{FORMAT_VERSION}; skipped")
        for name, digest in manifest["files"].items():
            if not (path / name).is_file():
                return f"checkpoint {path}: file {name} is missing; skipped"
            if sha256_file(path / name) != digest:
                return f"checkpoint {path}: file {name} does not match its SHA-256 (corrupted or truncated); skipped"
        return None

    @staticmethod
    def read(path: Path, verify: bool = True) -> CheckpointInfo | None:
        """The checkpoint at ``path`` if its manifest is readable (and, with ``verify``, its
        payload checksums match); None otherwise."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            manifest["files"], manifest["epoch"], manifest["step"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if verify and CheckpointManager.verify(path, manifest) is not None:
            return None
        return CheckpointInfo(path, manifest)

    def save(self, name: str, write_payload: Callable[[Path], None], manifest: dict[str, Any]) -> CheckpointInfo:
        """Write checkpoint ``name``: ``write_payload(tmpdir)`` writes the files, then the manifest
        with their checksums, fsync, rename into place, and prune old checkpoints."""
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
                    _fsync_path(child)
                    files[child.name] = sha256_file(child)
            manifest = {**manifest, "format_version": FORMAT_VERSION, "files": files}
            atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
            _fsync_path(tmp)
            faults.crash_before_publish(int(manifest["step"]))
            os.rename(tmp, final)
            _fsync_path(self.directory)
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

    def remove_temporaries(self) -> None:
        """Delete half-written ``.tmp-*`` folders a crashed writer left (rank 0, before training)."""
        if self.directory.is_dir():
            for child in self.directory.glob(".tmp-*"):
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)

    def best(self) -> CheckpointInfo | None:
        """The checkpoint with the best ``best_metric`` in its manifest's metrics, if any."""
        scored = [c for c in self.checkpoints()
                  if self.best_metric and isinstance(c.manifest.get("metrics"), dict)
                  and self.best_metric in c.manifest["metrics"]]
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
