"""hvdtrain.core.checkpoint: atomic rank-0 checkpoints with checksummed manifests."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from hvdtrain.core.checkpoint import (FORMAT_VERSION, MANIFEST, CheckpointError, CheckpointInfo,
                                      CheckpointManager, atomic_write_text, sha256_file)


def writer(files: dict[str, bytes]):
    """A payload writer that writes ``files`` into the temporary checkpoint folder."""
    def write(directory: Path) -> None:
        for name, data in files.items():
            (directory / name).write_bytes(data)
    return write


def meta(epoch: int, step: int, **extra) -> dict:
    return {"epoch": epoch, "step": step, **extra}


def save(manager: CheckpointManager, name: str, epoch: int, step: int, payload: bytes = b"") -> CheckpointInfo:
    return manager.save(name, writer({"model.bin": payload or f"model {name}".encode(),
                                      "optimizer.bin": f"optim {step}".encode()}), meta(epoch, step))


def names_on_disk(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_save_writes_folder_with_manifest_and_checksums(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints")
    files = {"model.bin": os.urandom(3000), "optimizer.bin": b"optimizer state", "empty.txt": b""}
    info = manager.save("epoch-0001", writer(files),
                        meta(1, 10, recipe="r", framework="torch", world_size=2, config={"train": {"epochs": 3}}))
    folder = tmp_path / "checkpoints" / "epoch-0001"
    assert info.path == folder
    assert info.epoch == 1 and info.step == 10
    assert names_on_disk(tmp_path / "checkpoints") == ["epoch-0001"]
    assert names_on_disk(folder) == sorted([*files, MANIFEST])
    for name, data in files.items():
        assert (folder / name).read_bytes() == data

    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest == info.manifest
    assert manifest["format_version"] == FORMAT_VERSION == 1
    assert manifest["recipe"] == "r" and manifest["framework"] == "torch" and manifest["world_size"] == 2
    assert manifest["config"] == {"train": {"epochs": 3}}
    assert manifest["epoch"] == 1 and manifest["step"] == 10
    assert manifest["files"] == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert MANIFEST not in manifest["files"]


def test_sha256_file_matches_hashlib(tmp_path):
    data = os.urandom((1 << 20) + 123)  # more than one read chunk
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()


def test_save_creates_missing_parent_directories(tmp_path):
    manager = CheckpointManager(tmp_path / "a" / "b" / "checkpoints")
    save(manager, "epoch-0001", 1, 5)
    assert manager.latest().path == tmp_path / "a" / "b" / "checkpoints" / "epoch-0001"


def test_empty_or_missing_directory_has_no_checkpoints(tmp_path):
    assert CheckpointManager(tmp_path / "missing").checkpoints() == []
    assert CheckpointManager(tmp_path / "missing").latest() is None
    assert CheckpointManager(tmp_path).latest() is None


def test_latest_is_newest_by_step_not_by_name(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=10)
    save(manager, "b", epoch=1, step=5)
    save(manager, "a", epoch=3, step=15)
    save(manager, "c", epoch=2, step=10)
    assert [c.path.name for c in manager.checkpoints()] == ["b", "c", "a"]
    latest = manager.latest()
    assert latest.path.name == "a"
    assert latest.step == 15 and latest.epoch == 3


@pytest.mark.parametrize("keep_last", [1, 2, 3])
def test_keep_last_prunes_older_checkpoints(tmp_path, keep_last):
    manager = CheckpointManager(tmp_path, keep_last=keep_last)
    for epoch in range(1, 6):
        save(manager, f"epoch-{epoch:04d}", epoch, epoch * 10)
        assert len(manager.checkpoints()) == min(epoch, keep_last)
    expected = [f"epoch-{e:04d}" for e in range(6 - keep_last, 6)]
    assert names_on_disk(tmp_path) == expected  # no .trash-* or .tmp-* leftovers
    assert [c.path.name for c in manager.checkpoints()] == expected
    assert manager.latest().path.name == "epoch-0005"


def test_refuses_to_overwrite_and_leaves_the_checkpoint_intact(tmp_path):
    manager = CheckpointManager(tmp_path)
    first = save(manager, "epoch-0001", 1, 10, payload=b"original")
    called = []

    def write(directory):
        called.append(directory)
        (directory / "model.bin").write_bytes(b"replacement")

    with pytest.raises(CheckpointError) as err:
        manager.save("epoch-0001", write, meta(1, 10))
    assert "epoch-0001" in str(err.value) and "already exists" in str(err.value)
    assert called == []
    assert (first.path / "model.bin").read_bytes() == b"original"
    assert names_on_disk(tmp_path) == ["epoch-0001"]
    assert CheckpointManager.read(first.path, verify=True) is not None
    assert manager.latest().path == first.path


def test_checkpoint_error_is_a_runtime_error():
    assert issubclass(CheckpointError, RuntimeError)


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failing_payload_writer_leaves_nothing_behind(tmp_path, error):
    manager = CheckpointManager(tmp_path)
    previous = save(manager, "epoch-0001", 1, 10)

    def write(directory):
        (directory / "model.bin").write_bytes(b"half of the model")
        raise error

    with pytest.raises(type(error)):
        manager.save("epoch-0002", write, meta(2, 20))
    assert names_on_disk(tmp_path) == ["epoch-0001"]
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.rglob("*"))
    assert manager.latest().path == previous.path
    # the name is free for a later, successful attempt
    assert save(manager, "epoch-0002", 2, 20).path == tmp_path / "epoch-0002"
    assert manager.latest().path.name == "epoch-0002"


def test_partial_and_foreign_folders_are_ignored(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=10)
    good = save(manager, "epoch-0001", 1, 10)

    # a complete-looking checkpoint still under its temporary name (crash before the rename)
    leftover = tmp_path / f".tmp-epoch-0002-{os.getpid() + 1}"
    leftover.mkdir()
    (leftover / "model.bin").write_bytes(b"x")
    (leftover / MANIFEST).write_text(json.dumps(
        {"format_version": 1, "epoch": 2, "step": 20, "files": {"model.bin": hashlib.sha256(b"x").hexdigest()}}))
    # a folder without a manifest
    (tmp_path / "epoch-0099").mkdir()
    (tmp_path / "epoch-0099" / "model.bin").write_bytes(b"y")
    # a manifest that is not JSON, and one without a step
    (tmp_path / "epoch-0098").mkdir()
    (tmp_path / "epoch-0098" / MANIFEST).write_text("{not json")
    (tmp_path / "epoch-0097").mkdir()
    (tmp_path / "epoch-0097" / MANIFEST).write_text(json.dumps({"epoch": 97, "files": {}}))
    # a stray file
    (tmp_path / "notes.txt").write_text("hello")

    assert [c.path for c in manager.checkpoints()] == [good.path]
    assert manager.latest().path == good.path
    assert CheckpointManager.read(tmp_path / "epoch-0099") is None
    assert CheckpointManager.read(tmp_path / "epoch-0098") is None
    assert CheckpointManager.read(tmp_path / "epoch-0097") is None


def test_corrupted_payload_falls_back_to_the_previous_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=5)
    first = save(manager, "epoch-0001", 1, 10)
    second = save(manager, "epoch-0002", 2, 20, payload=os.urandom(512))
    assert manager.latest().path == second.path

    path = second.path / "model.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    assert CheckpointManager.read(second.path, verify=True) is None
    assert CheckpointManager.read(second.path, verify=False) is not None
    assert manager.latest().path == first.path

    (first.path / "optimizer.bin").unlink()  # a missing payload file is corrupt too
    assert manager.latest() is None


def test_truncated_payload_is_detected(tmp_path):
    manager = CheckpointManager(tmp_path)
    first = save(manager, "epoch-0001", 1, 10)
    second = save(manager, "epoch-0002", 2, 20, payload=b"0123456789")
    (second.path / "model.bin").write_bytes(b"01234")
    assert manager.latest().path == first.path


def test_latest_reports_the_damaged_newer_checkpoints_and_set_aside_keeps_them(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=5)
    first = save(manager, "epoch-0001", 1, 10)
    second = save(manager, "epoch-0002", 2, 20)
    third = save(manager, "epoch-0003", 3, 30)
    (third.path / "model.bin").write_bytes(b"truncated")
    (second.path / "optimizer.bin").unlink()
    problems: list[str] = []
    damaged: list[CheckpointInfo] = []
    assert manager.latest(problems, damaged).path == first.path
    assert [info.path for info in damaged] == [third.path, second.path]  # newest first
    assert "epoch-0003" in problems[0] and "model.bin" in problems[0] and "SHA-256" in problems[0]
    assert "epoch-0002" in problems[1] and "optimizer.bin" in problems[1] and "missing" in problems[1]
    assert names_on_disk(tmp_path) == ["epoch-0001", "epoch-0002", "epoch-0003"]  # finding moves nothing

    notes = manager.set_aside(damaged)
    assert [n.split(" aside to ")[0] for n in notes] == ["moved damaged checkpoint epoch-0003",
                                                         "moved damaged checkpoint epoch-0002"]
    on_disk = names_on_disk(tmp_path)
    assert on_disk[-1] == "epoch-0001" and len(on_disk) == 3
    assert all(n.split(" aside to ")[1] in on_disk for n in notes)  # kept, renamed out of the way
    assert [c.path for c in manager.checkpoints()] == [first.path]


def test_atomic_write_text_replaces_content_without_leftovers(tmp_path):
    target = tmp_path / "config.yaml"
    atomic_write_text(target, "first\n")
    assert target.read_text() == "first\n"
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    atomic_write_text(str(target), "")
    assert target.read_text() == ""
    assert names_on_disk(tmp_path) == ["config.yaml"]


# issue 10, item 1: checkpoints are ordered by the position in the data, which means the same for
# any number of workers, not by the step count (whose units depended on the world size).
def test_latest_and_pruning_follow_the_position_in_the_data(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", keep_last=2)
    # written in this order by one run: step units changed with the world size in between, so a
    # later checkpoint can carry a smaller step than an earlier one
    manager.save("step-00000040", writer({"m": b"1"}), meta(1, 40, consumed=128))
    manager.save("epoch-0002", writer({"m": b"2"}), meta(2, 30))
    manager.save("step-00000034", writer({"m": b"3"}), meta(2, 34, consumed=256))
    assert [c.path.name for c in manager.checkpoints()] == ["epoch-0002", "step-00000034"]
    assert manager.latest().path.name == "step-00000034"
    assert manager.checkpoints()[0].progress == (2, 0, 30)


# issue 22, item 4: an explicit open of one checkpoint fails with one line naming the folder
@pytest.mark.parametrize("manifest_text, expected", [
    ("{torn", "not readable JSON"),
    (json.dumps({"epoch": "x", "step": 1, "files": {"model.bin": "0" * 64}}), "'epoch' is 'x'"),
    (json.dumps({"epoch": 1, "step": 1, "files": {"/etc/passwd": "0" * 64}}), "not a plain name"),
    (json.dumps({"epoch": 1, "step": 1, "files": {}}), "'files' must list"),
])
def test_open_names_the_folder_of_a_malformed_manifest_in_one_line(tmp_path, manifest_text, expected):
    manager = CheckpointManager(tmp_path, keep_last=5)
    good = save(manager, "epoch-0001", 1, 10)
    bad = save(manager, "epoch-0002", 2, 20).path
    (bad / MANIFEST).write_text(manifest_text)
    with pytest.raises(CheckpointError) as err:
        CheckpointManager.open(bad)
    message = str(err.value)
    assert str(bad) in message and expected in message and "\n" not in message
    assert CheckpointManager.open(good.path).path == good.path
    problems: list[str] = []
    damaged: list[CheckpointInfo] = []
    assert manager.latest(problems, damaged).path == good.path
    assert [info.path for info in damaged] == [bad] and str(bad) in problems[0]
