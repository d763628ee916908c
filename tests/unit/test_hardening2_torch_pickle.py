"""Issue 41, item 2: the TensorFlow side's reader of ``.pth`` files checks each tensor's geometry.

``torch_pickle._rebuild_tensor`` handed the file's size, stride and offset to ``as_strided``
unchecked: a crafted file crashed the process (exit 139) or read process memory into the weights
(4 stored floats declared as 200,000). The files here are written opcode by opcode, as
``torch.save`` writes a state dict (a zip with ``archive/data.pkl`` naming
``torch._utils._rebuild_tensor_v2`` and a ``FloatStorage``), so no torch is needed.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hvdtrain_recipes.image_classification import torch_pickle
from hvdtrain_recipes.image_classification.torch_pickle import NotWeightsError

REPO = Path(__file__).resolve().parents[2]


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _int(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw  # LONG1: any integer


def _ints(values: tuple[int, ...]) -> bytes:
    return b"(" + b"".join(_int(v) for v in values) + b"t"


def torch_file(path: Path, size: tuple, stride: tuple, offset: int = 0, stored: int = 4) -> Path:
    """A ``torch.save``-style file: ``{"w": tensor}`` whose storage holds ``stored`` float32 values
    1, 2, ... and whose tensor claims ``size``, ``stride`` and ``offset``."""
    ordered_dict = b"ccollections\nOrderedDict\n)R"
    pickle = (b"\x80\x02" + ordered_dict + _text("w") + b"ctorch._utils\n_rebuild_tensor_v2\n("
              + b"(" + _text("storage") + b"ctorch\nFloatStorage\n" + _text("0") + _text("cpu") + _int(stored) + b"tQ"
              + _int(offset) + _ints(size) + _ints(stride) + b"\x89" + ordered_dict + b"tRs.")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/data/0", np.arange(1, stored + 1, dtype="<f4").tobytes())
    return path


def test_a_well_formed_file_reads(tmp_path):
    state = torch_pickle.load(torch_file(tmp_path / "ok.pth", (2, 2), (2, 1)))
    assert state["w"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert torch_pickle.load(torch_file(tmp_path / "t.pth", (2, 2), (1, 2)))["w"].tolist() == [[1, 3], [2, 4]]
    assert torch_pickle.load(torch_file(tmp_path / "o.pth", (2,), (1,), offset=2))["w"].tolist() == [3, 4]
    assert torch_pickle.load(torch_file(tmp_path / "e.pth", (0, 5), (5, 1)))["w"].shape == (0, 5)


CRAFTED = {
    "4 floats declared as 200,000": dict(size=(200_000,), stride=(1,)),
    "stride past the end": dict(size=(2, 2), stride=(1_000_000, 1)),
    "offset past the end": dict(size=(1,), stride=(1,), offset=10_000_000),
    "negative stride": dict(size=(4,), stride=(-1,)),
    "negative size": dict(size=(-4,), stride=(1,)),
    "size and stride disagree": dict(size=(2, 2), stride=(1,)),
    "stride 0 repeats one value a million times": dict(size=(1_000_000,), stride=(0,)),
    "huge numbers": dict(size=(2**70,), stride=(1,)),
}


@pytest.mark.parametrize("name", CRAFTED)
def test_a_tensor_reaching_past_its_storage_is_refused(name, tmp_path):
    path = torch_file(tmp_path / "crafted.pth", **CRAFTED[name])
    with pytest.raises(NotWeightsError) as caught:
        torch_pickle.load(path)
    assert "\n" not in str(caught.value)


def test_a_crafted_file_does_not_crash_the_process(tmp_path):
    """The segfault of before, in a child process (it took the test process down): now exit 0 with
    the refusal, whatever the memory beyond the storage holds."""
    path = torch_file(tmp_path / "crafted.pth", size=(64, 1 << 20), stride=(1 << 40, 1))
    code = ("import sys; from hvdtrain_recipes.image_classification import torch_pickle as t\n"
            "try:\n    t.load(sys.argv[1])\nexcept t.NotWeightsError as e:\n    print('refused:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("refused:"), (proc.returncode, proc.stdout, proc.stderr)


def test_a_zip_bomb_storage_is_refused_before_it_is_unpacked(tmp_path):
    path = torch_file(tmp_path / "bomb.pth", (4,), (1,))
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data/1", b"\0" * (32 << 20))
    data = zipfile.ZipFile(path).read("archive/data.pkl").replace(_text("0") + _text("cpu"), _text("1") + _text("cpu"))
    rebuilt = tmp_path / "bomb2.pth"
    with zipfile.ZipFile(path) as old, zipfile.ZipFile(rebuilt, "w", compression=zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            new.writestr(info.filename, data if info.filename.endswith("data.pkl") else old.read(info))
    with pytest.raises(NotWeightsError, match="unpacks to"):
        torch_pickle.load(rebuilt)


def test_the_tensorflow_loader_names_the_file_in_one_line(tmp_path):
    from hvdtrain.core.config import ConfigError
    from hvdtrain_recipes.image_classification.torchvision_weights import read_state_dict

    path = torch_file(tmp_path / "resnet18.pth", size=(200_000,), stride=(1,))
    with pytest.raises(ConfigError) as caught:
        read_state_dict(path, "tensorflow")
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
