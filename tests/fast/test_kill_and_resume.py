"""Kill-and-resume exactness in-process: a run interrupted mid-epoch and resumed ends bitwise equal
to an uninterrupted one (weights, optimizer state, metrics history)."""

from __future__ import annotations

import numpy as np
import pytest
from toyrun import Interrupt, StopAt, fit, without_timing


pytestmark = pytest.mark.resume


def npz_arrays(path) -> dict[str, np.ndarray]:
    with np.load(path) as saved:
        return {k: saved[k] for k in saved.files}


def assert_same_checkpoint(a, b) -> None:
    for file in ("model.npz", "optimizer.npz"):
        left, right = npz_arrays(a / file), npz_arrays(b / file)
        assert sorted(left) == sorted(right)
        for name in left:
            assert left[name].dtype == right[name].dtype
            assert np.array_equal(left[name], right[name]), f"{a.name}/{file}:{name} differs"
            assert left[name].tobytes() == right[name].tobytes()  # bitwise, not just equal values


@pytest.mark.parametrize("every, stop_at, accumulation", [
    (5, 7, 1),  # inside epoch 1, after step-00000005
    (5, 17, 1),  # inside epoch 2, after epoch-0001 and step-00000015
    (5, 13, 1),  # first step of epoch 2: resumes from epoch-0001
    (5, 3, 1),  # before any checkpoint: starts from scratch
    (2, 5, 2),  # with gradient accumulation
])
def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(tmp_path, every, stop_at, accumulation):
    overrides = ("train.epochs=2", f"checkpoint.every_steps={every}", "checkpoint.keep_last=100",
                 f"train.grad_accumulation={accumulation}", "optim.weight_decay=0.001")
    reference = fit(tmp_path / "reference", *overrides)
    with pytest.raises(Interrupt):
        fit(tmp_path / "run", *overrides, callbacks=[StopAt(stop_at)])
    resumed = fit(tmp_path / "run", *overrides, "checkpoint.resume=true")

    assert resumed.names() == reference.names()
    assert resumed.result.checkpoint.name == reference.result.checkpoint.name == "epoch-0002"
    for name in reference.names():
        assert_same_checkpoint(resumed.checkpoints / name, reference.checkpoints / name)
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())
    assert without_timing(resumed.result.history) == without_timing(reference.result.history)
    assert (tmp_path / "run" / "config.yaml").read_text().replace("/run", "/X") == \
        (tmp_path / "reference" / "config.yaml").read_text().replace("/reference", "/X").replace(
            "resume: false", "resume: true")


def test_interrupted_twice_still_exact(tmp_path):
    overrides = ("train.epochs=2", "checkpoint.every_steps=4", "checkpoint.keep_last=100")
    reference = fit(tmp_path / "reference", *overrides)
    with pytest.raises(Interrupt):
        fit(tmp_path / "run", *overrides, callbacks=[StopAt(6)])
    with pytest.raises(Interrupt):
        fit(tmp_path / "run", *overrides, "checkpoint.resume=true", callbacks=[StopAt(19)])
    resumed = fit(tmp_path / "run", *overrides, "checkpoint.resume=true")
    assert_same_checkpoint(resumed.checkpoints / "epoch-0002", reference.checkpoints / "epoch-0002")
    assert without_timing(resumed.metrics()) == without_timing(reference.metrics())
