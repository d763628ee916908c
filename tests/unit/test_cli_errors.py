"""issue 10, item 10: a user's mistake is one clear line; an unexpected failure keeps its traceback.

A CUDA out-of-memory or an NCCL failure arrives as a RuntimeError, a broken file system as an
OSError, a bug as a KeyError: those must not look like a bad flag."""

from __future__ import annotations

import pytest

from hvdtrain.cli.common import fail
from hvdtrain.core.checkpoint import CheckpointError
from hvdtrain.core.config import ConfigError
from hvdtrain.core.loop import TrainingError
from hvdtrain.core.registry import RecipeError


def _raise(exc):
    raise exc


def _fail_with(exc, capsys):
    try:
        _raise(exc)
    except Exception as caught:
        with pytest.raises(SystemExit) as exit_info:
            fail(caught)
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("exc, code", [
    (ConfigError("train.batch_size: 0 is out of range"), 2),
    (RecipeError("unknown recipe 'x'"), 2),
    (ValueError("model.name 'vgg' is not allowed"), 1),
    (TrainingError("output directory /x is not writable"), 1),
    (CheckpointError("checkpoint /x already exists"), 1),
])
def test_user_mistakes_are_one_line(monkeypatch, capsys, exc, code):
    monkeypatch.delenv("HVDTRAIN_TRACEBACK", raising=False)
    exit_code, err = _fail_with(exc, capsys)
    assert exit_code == code
    assert err == f"hvdtrain: error: {exc}\n"


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    OSError(5, "Input/output error"),
    KeyError("running_mean"),
])
def test_unexpected_failures_keep_their_traceback(monkeypatch, capsys, exc):
    monkeypatch.delenv("HVDTRAIN_TRACEBACK", raising=False)
    exit_code, err = _fail_with(exc, capsys)
    assert exit_code == 1
    assert "Traceback (most recent call last)" in err and "in _raise" in err
    assert err.rstrip().endswith(f"hvdtrain: error: {exc}")
