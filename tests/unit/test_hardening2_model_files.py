"""Issue 41, items 1, 5 and 8: model folders, exports and checkpoints from elsewhere run no code,
cannot take all memory, and fail in one line naming the file.

Item 1: a Hugging Face folder with an ``auto_map`` and a ``*.py`` beside it ran that code after
one "y" on stdin (``echo y | hvdtrain predict RUN IMG``, ``... recipe image-classification --model
DIR``). Item 5: a crafted ``image_model.json`` size, a ``comm_state.npz`` rank or a shard's class
index sized a list. Item 8: a pickled ``pytorch_model.bin``, a checkpoint ``model.pt`` with pickled
code, a Keras export naming ``os.system``, a full disk while exporting (a ``SafetensorError``
traceback and ``.tmp-model-*/`` left behind) and a malformed ``rank_state.json`` ended in
tracebacks or messages naming no file. Every case here uses the real loaders on real files, in
this process.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import resource
import signal
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from envguard import isolate_environ
from jobs import REPO

sys.path.insert(0, str(REPO / "tests" / "distributed" / "workers"))

LABELS = ["cat", "dog"]


class RunsCode:
    """Pickled, it calls ``os.system`` (what an attacker's weights file does): loading it must
    refuse before the call."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(autouse=True)
def _environ(monkeypatch):
    # set by torch when transformers loads a model, by cv2 when Keras imports it
    isolate_environ(monkeypatch, ("TORCHINDUCTOR_CACHE_DIR", "LD_LIBRARY_PATH"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))  # `echo y | hvdtrain ...`: a prompt would get "y"


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory):
    pytest.importorskip("transformers")
    from hf_image_tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("hf") / "vit", "vit")


def copy_of(folder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(folder, to)
    return to


# --- item 1: a folder's own code never runs -------------------------------------------------------

def with_remote_code(folder: Path) -> Path:
    """``folder`` made a model of a type transformers does not know, whose ``auto_map`` names code
    beside it (``evil.py`` writes ``RAN`` when imported): transformers asks on stdin whether to run
    it, and ran it after one "y"."""
    marker = folder / "RAN"
    (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('code ran')\n"
                                    "from transformers import ViTConfig, ViTForImageClassification\n"
                                    "class EvilConfig(ViTConfig):\n    model_type = 'evilnet'\n"
                                    "class EvilModel(ViTForImageClassification):\n    config_class = EvilConfig\n")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "evilnet"
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForImageClassification": "evil.EvilModel",
                          "AutoModelForSequenceClassification": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    return marker


def test_a_model_folder_with_an_auto_map_is_refused_and_its_code_never_runs(tiny_vit, tmp_path):
    from hvdtrain_recipes.bert_finetune.torch_recipe import load_model as bert_load_model
    from hvdtrain_recipes.image_classification import hf_models, hf_torch

    folder = copy_of(tiny_vit, tmp_path / "evil-model")
    marker = with_remote_code(folder)
    errors = []
    for load in (lambda: hf_torch.load_model(hf_models.resolve(str(folder)), LABELS, seed=0),  # --model DIR
                 lambda: hf_torch.load_export(folder, [0.5] * 3, [0.5] * 3),  # hvdtrain predict RUN IMG
                 lambda: bert_load_model(folder, LABELS, 0)):  # bert-finetune's --model
        try:
            load()
        except Exception as exc:  # noqa: BLE001  (which one is checked below, after the marker)
            errors.append(exc)
        assert not marker.exists(), "the folder's own code ran"
    from hvdtrain_recipes.model_files import ModelFileError

    assert len(errors) == 3 and all(isinstance(e, ModelFileError) for e in errors), errors
    assert all(f"model folder {folder} asks to run its own code" in str(e) and "\n" not in str(e) for e in errors)


# --- item 8: pickled weights in a model folder, a checkpoint, a Keras export --------------------------

def test_a_pickled_pytorch_model_bin_is_one_line_naming_the_folder(tiny_vit, tmp_path):
    from hvdtrain_recipes.image_classification import hf_models, hf_torch
    from hvdtrain_recipes.model_files import ModelFileError

    folder = copy_of(tiny_vit, tmp_path / "model")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "RAN"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"vit.embeddings.cls_token": RunsCode(marker)}, protocol=2))
    with pytest.raises(ModelFileError) as caught:
        hf_torch.load_model(hf_models.resolve(str(folder)), LABELS, seed=0)
    assert f"cannot load the model in {folder}" in str(caught.value) and "\n" not in str(caught.value)
    assert "GLOBAL posix.system" in str(caught.value)
    assert not marker.exists()


def test_a_checkpoint_file_with_pickled_code_is_one_line_naming_it(tmp_path):
    from hvdtrain.core.checkpoint import CheckpointError
    from hvdtrain.torch.weights import load_weights_only

    marker = tmp_path / "RAN"
    (tmp_path / "model.pt").write_bytes(pickle.dumps(RunsCode(marker), protocol=2))  # torch.save's protocol
    with pytest.raises(CheckpointError) as caught:
        load_weights_only(tmp_path / "model.pt", map_location="cpu")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'model.pt'} holds pickled objects besides tensors")
    assert "system" in message and "\n" not in message and not marker.exists()


def test_a_keras_export_naming_os_system_is_one_line_naming_the_file(tmp_path):
    pytest.importorskip("keras")
    from hvdtrain_recipes.model_files import ModelFileError, load_keras

    marker = tmp_path / "RAN"
    path = tmp_path / "model.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.15.1", "date_saved": "2026-11-27"}))
        archive.writestr("config.json", json.dumps({
            "module": "os", "class_name": "system", "registered_name": "system",
            "config": {"command": f"touch {marker}"}, "build_config": {"input_shape": [None, 4]}}))
        archive.writestr("model.weights.h5", b"")
    with pytest.raises(ModelFileError) as caught:
        load_keras(path)
    assert str(caught.value).startswith(f"{path} is not a Keras model hvdtrain can load")
    assert "\n" not in str(caught.value) and not marker.exists()


def test_a_full_disk_while_exporting_is_one_line_and_leaves_nothing(tmp_path):
    from safetensors.numpy import save_file

    from hvdtrain_recipes.image_classification.export import RECORD_FILE, write_export
    from hvdtrain_recipes.model_files import ModelFileError

    earlier = tmp_path / "model"
    earlier.mkdir()
    (earlier / RECORD_FILE).write_text(json.dumps({"labels": LABELS, "framework": "torch", "size": 8}))  # earlier
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}

    def write_model(folder):
        save_file({"w": np.zeros(1 << 20, dtype=np.float32)}, str(folder / "model.safetensors"))  # 4 MiB

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        with pytest.raises(ModelFileError) as caught:
            write_export(tmp_path, write_model, {"labels": LABELS})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert str(caught.value).startswith(f"cannot write the export {earlier}") and "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], "a temporary folder was left behind"
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before, "the earlier export changed"


def test_an_export_is_published_whole(tmp_path):
    from hvdtrain_recipes.image_classification.export import RECORD_FILE, write_export

    target = write_export(tmp_path, lambda folder: (folder / "weights").write_bytes(b"w"), {"labels": LABELS})
    assert sorted(p.name for p in target.iterdir()) == [RECORD_FILE, "weights"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_malformed_rank_state_is_named(tmp_path):
    from hvdtrain.core.checkpoint import CheckpointError
    from hvdtrain.core.resume import RANK_STATE_FILE, capture_rng, read_rank_states

    good = [{"rng": capture_rng()}, {"rng": capture_rng()}]
    (tmp_path / RANK_STATE_FILE).write_text(json.dumps(good))
    assert len(read_rank_states(tmp_path, 2)) == 2
    bad = json.loads(json.dumps(good))
    bad[1]["rng"]["python"][1] = [1, 2, 3]  # "state vector is the wrong size" before, naming no file
    for content, size in ((bad, 2), (good, 3), ({"rng": 1}, 1), ("[", 1)):
        (tmp_path / RANK_STATE_FILE).write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(CheckpointError, match=rf"^{tmp_path / RANK_STATE_FILE} is not the ranks' saved state"):
            read_rank_states(tmp_path, size)


# --- item 5: numbers in files bounded before they size anything ------------------------------------

def test_a_comm_state_rank_beyond_the_world_size_is_refused(tmp_path):
    from hvdtrain.core import compression_state
    from hvdtrain.core.checkpoint import CheckpointError

    with open(tmp_path / compression_state.STATE_FILE, "wb") as f:
        np.savez(f, **{"0/steps": np.asarray(1), "100000/model_buffer/00000": np.zeros(2)})
    with pytest.raises(CheckpointError, match=r"key '100000/model_buffer/00000' is not RANK/NAME with a rank below "
                                              r"the checkpoint's world size 2"):
        compression_state.read(tmp_path, 2)


def export_folder(tmp_path: Path, **change) -> Path:
    from hvdtrain_recipes.image_classification.export import RECORD_FILE, make_record

    class Policy:
        size, kind, val_crop = 32, "resize", 0.875

    folder = tmp_path / "run" / "model"
    folder.mkdir(parents=True)
    record = make_record(labels=LABELS, framework="torch", source="hvdtrain", model="small_cnn", policy=Policy,
                         channels=3, grayscale=False, mean=[0.5] * 3, std=[0.5] * 3)
    record.update(change)
    (folder / RECORD_FILE).write_text(json.dumps(record))
    return folder


@pytest.mark.parametrize("change, needle", [
    ({"size": 5000}, "'size' is '5000'; it must be an integer in 8-4096"),
    ({"size": "224"}, "'size' is '224'"),
    ({"channels": 7}, "'channels' is '7'; it must be 1 or 3"),
    ({"labels": []}, "'labels' is '[]'"),
    ({"val_crop": 0}, "'val_crop' is '0'"),
    ({"mean": [0.5] * 1000}, "'mean'"),
    ({"framework": "jax"}, "'framework' is 'jax'"),
])
def test_an_image_model_json_is_checked_before_anything_is_built(tmp_path, change, needle):
    from PIL import Image

    from hvdtrain_recipes.image_classification.predict import predict
    from hvdtrain_recipes.model_files import ModelFileError

    folder = export_folder(tmp_path, **change)
    image = tmp_path / "a.png"
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(image)
    with pytest.raises(ModelFileError) as caught:
        predict(folder.parent, [str(image)])
    assert str(caught.value).startswith(f"{folder / 'image_model.json'}: ") and needle in str(caught.value)


def test_a_class_index_beyond_any_class_count_is_refused(tmp_path):
    import tarfile

    from hvdtrain.data.errors import DataError
    from hvdtrain.data.shards import load_shard_index
    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8), mode="L").save(png, format="PNG")
    shard = tmp_path / "train-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for key, label in (("a", b"0"), ("b", b"2000000")):
            for ext, data in (("png", png.getvalue()), ("cls", label)):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=r"sample 'b' has the class index 2000000; without a class list"):
        load_shard_index([shard], "webdataset", cache=tmp_path / "cache")


def test_both_frameworks_refuse_the_folder_when_it_is_resolved(tiny_vit, tmp_path):
    """The TensorFlow side (keras-hub) would not run the code, but the folder is refused the same
    way for both frameworks, when ``--model`` is resolved (before the data is read)."""
    from hvdtrain_recipes.bert_finetune.pretrained import resolve_model_dir
    from hvdtrain_recipes.image_classification import hf_models
    from hvdtrain_recipes.model_files import ModelFileError

    folder = copy_of(tiny_vit, tmp_path / "evil-model")
    marker = with_remote_code(folder)
    (folder / "tokenizer.json").write_text("{}")
    for resolve in (hf_models.resolve, resolve_model_dir):
        with pytest.raises(ModelFileError, match="asks to run its own code"):
            resolve(str(folder))
    assert not marker.exists()
