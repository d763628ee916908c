"""Issue 22, items 4 and 7: a checkpoint manifest is data from disk, not trusted.

Each test trains recipe ``toy``, edits the newest checkpoint's ``manifest.json`` (or leaves a
killed prune's ``.trash-*`` folder) the way an attacker, a bug or a crash would, and starts again:
the damaged checkpoint is skipped with a warning naming its folder, the run falls back to the one
before and continues exactly as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from numpy_adapter import NumpyAdapter, load_weights
from toyrun import fit, without_timing

pytestmark = pytest.mark.resume


def _edit_manifest(folder, edit) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


class DeclaringAdapter(NumpyAdapter):
    """The NumPy adapter declaring the files its load_state reads, as the torch and TensorFlow
    adapters do (``model.pt``/``optimizer.pt``, ``model_variables.npz``/``optimizer.npz``)."""

    checkpoint_files = ("model.npz", "optimizer.npz")


def _resumes_from_epoch_1_exactly(tmp_path, capsys, damage) -> str:
    """Train 2 epochs, ``damage(epoch-0002's folder)``, resume: epoch 2 is trained again from
    epoch-0001 and ends bitwise where an uninterrupted run does. Returns what the resume warned."""
    reference = fit(tmp_path / "reference", "train.epochs=2")
    run = fit(tmp_path / "run", "train.epochs=2")
    damage(run.checkpoints / "epoch-0002")
    capsys.readouterr()
    resumed = fit(tmp_path / "run", "train.epochs=2", "checkpoint.resume=true", adapter=DeclaringAdapter())
    err = capsys.readouterr().err
    assert len(resumed.adapter.applied_lrs) == 12  # only epoch 2 was trained, from epoch-0001
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())
    for name, array in load_weights(reference.checkpoints / "epoch-0002").items():
        assert np.array_equal(load_weights(resumed.checkpoints / "epoch-0002")[name], array)
    return err


@pytest.mark.parametrize("name", ["../../victim.txt", "ABSOLUTE"])
def test_a_manifest_naming_a_file_outside_its_folder_is_skipped(tmp_path, capsys, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("a user's file")
    name = str(victim) if name == "ABSOLUTE" else name

    def damage(folder):
        _edit_manifest(folder, lambda m: m["files"].update({name: hashlib.sha256(victim.read_bytes()).hexdigest()}))

    err = _resumes_from_epoch_1_exactly(tmp_path, capsys, damage)
    assert "epoch-0002" in err and "not a plain name inside the folder" in err
    assert victim.read_text() == "a user's file"


def test_a_manifest_listing_no_files_does_not_vouch_for_a_truncated_model(tmp_path, capsys):
    def damage(folder):
        _edit_manifest(folder, lambda m: m.update(files={}))
        model = folder / "model.npz"
        model.write_bytes(model.read_bytes()[:100])

    err = _resumes_from_epoch_1_exactly(tmp_path, capsys, damage)
    assert "epoch-0002" in err and "files" in err


def test_a_file_the_manifest_does_not_list_makes_the_checkpoint_damaged(tmp_path, capsys):
    def damage(folder):  # model.npz dropped from the list, then truncated: nothing checks it
        _edit_manifest(folder, lambda m: m["files"].pop("model.npz"))
        model = folder / "model.npz"
        model.write_bytes(model.read_bytes()[:100])

    err = _resumes_from_epoch_1_exactly(tmp_path, capsys, damage)
    assert "epoch-0002" in err and "model.npz is not listed" in err


def test_a_file_the_loader_reads_missing_from_folder_and_manifest_makes_the_checkpoint_damaged(tmp_path, capsys):
    def damage(folder):  # model.npz gone, and gone from the list: the rest still verifies
        _edit_manifest(folder, lambda m: m["files"].pop("model.npz"))
        (folder / "model.npz").unlink()

    err = _resumes_from_epoch_1_exactly(tmp_path, capsys, damage)
    assert "epoch-0002" in err and "model.npz is missing" in err


@pytest.mark.parametrize("edit", [
    lambda m: m.update(epoch="two"),
    lambda m: m.update(files=["model.npz"]),
    lambda m: m.update(step=None),
], ids=["epoch-not-a-number", "files-a-list", "step-null"])
def test_a_malformed_manifest_is_skipped_with_a_warning_naming_its_folder(tmp_path, capsys, edit):
    err = _resumes_from_epoch_1_exactly(tmp_path, capsys, lambda folder: _edit_manifest(folder, edit))
    assert "epoch-0002" in err and "manifest.json" in err and "skipped" in err


def test_a_manifest_that_is_not_json_is_skipped_with_a_warning_naming_its_folder(tmp_path, capsys):
    err = _resumes_from_epoch_1_exactly(
        tmp_path, capsys, lambda folder: (folder / "manifest.json").write_text("{torn"))
    assert "epoch-0002" in err and "not readable JSON" in err


def test_trash_folders_a_killed_prune_left_are_removed_at_the_next_start(tmp_path):
    run = fit(tmp_path, "train.epochs=1", "checkpoint.keep_last=1")
    trash = run.checkpoints / ".trash-epoch-0000-999999"  # a prune killed between rename and delete
    (trash / "sub").mkdir(parents=True)
    (trash / "model.npz").write_bytes(b"x" * 1000)
    (trash / "sub" / "f").write_text("y")
    resumed = fit(tmp_path, "train.epochs=2", "checkpoint.resume=true", "checkpoint.keep_last=1")
    assert resumed.aside() == []
    assert resumed.names() == ["epoch-0002"]
