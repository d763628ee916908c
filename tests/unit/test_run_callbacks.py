"""hvdtrain.run(..., callbacks=[...]): the caller's Callbacks run in the training, in-process (np=1) and in
every worker (shipped with the job through the authenticated channel)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest

import hvdtrain
from hvdtrain import api
from hvdtrain.launch import jobchannel
from hvdtrain.core.loop import RunResult


class Marker(hvdtrain.Callback):
    """A user's callback with state of its own."""

    def __init__(self, tag: str) -> None:
        self.tag = tag


@pytest.fixture
def trained(monkeypatch):
    """api.train replaced by a recorder: what the training would have received."""
    seen = {}

    def train(config, callbacks=()):
        seen["config"], seen["callbacks"] = config, list(callbacks)
        return RunResult(Path(config.output), [{"epoch": 1}], None, 1)

    monkeypatch.setattr(api, "train", train)
    return seen


def test_in_process_the_callbacks_reach_the_training(tmp_path, trained):
    marker = Marker("one")
    hvdtrain.run("image-classification", framework="torch", np=1, output=str(tmp_path), callbacks=[marker])
    assert trained["callbacks"] == [marker]


def test_a_callback_that_is_not_one_is_refused_before_anything_starts(tmp_path, trained):
    with pytest.raises(TypeError, match=r"^callbacks: builtins.function is not a hvdtrain.Callback"):
        hvdtrain.run("image-classification", np=1, output=str(tmp_path), callbacks=[lambda *a: None])
    assert trained == {}


def test_the_callbacks_travel_with_the_job_to_each_worker(tmp_path, trained, monkeypatch):
    import cloudpickle

    config = api.resolve_config("image-classification", "torch", output=str(tmp_path))
    key = secrets.token_bytes(32)
    channel = jobchannel.Channel("127.0.0.1", key, cloudpickle.dumps(
        (config, hvdtrain.get_recipe("image-classification"), [Marker("shipped")])))
    try:
        monkeypatch.setattr(sys, "argv", ["-c", channel.address, str(channel.port), key.hex()])
        monkeypatch.delenv("HOROVOD_RANK", raising=False)
        api._task_main()  # what each worker runs
        assert [type(c).__name__ for c in trained["callbacks"]] == ["Marker"]
        assert trained["callbacks"][0].tag == "shipped"  # the worker's own copy, state included
        assert channel.result()["history"] == [{"epoch": 1}]
    finally:
        channel.close()
