"""``train.compile``: the key's values, the compile-time line, and what each framework compiles
(in process; the distributed proof is tests/distributed/test_compiled_steps.py)."""

from __future__ import annotations

import io

import pytest

from envguard import isolate_environ
from hvdtrain.core.compiled import MODES, FirstStepClock, compiling
from hvdtrain.core.config import ConfigError
from hvdtrain.core.resolve import load_config


@pytest.mark.parametrize("value", ["none", *MODES])
def test_every_mode_is_a_value_of_the_key(value):
    config = load_config(overrides=[f"train.compile={value}"], framework="torch")
    assert config.train.compile == value and compiling(config) == (value != "none")


def test_eager_by_default_and_a_bad_value_names_the_key_and_the_choices():
    assert load_config().train.compile == "none"
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["train.compile=fast"])
    message = str(info.value)
    assert "\n" not in message and "train.compile" in message and "'fast'" in message
    for mode in ("none", *MODES):
        assert mode in message, message


def test_tensorflow_compiles_with_default_only():
    assert load_config(overrides=["train.compile=default"], framework="tensorflow").train.compile == "default"
    with pytest.raises(ConfigError, match="train.compile=max-autotune is a torch.compile mode"):
        load_config(overrides=["train.compile=max-autotune"], framework="tensorflow")


def test_cuda_graph_modes_refuse_accumulation_on_a_gpu_only():
    from hvdtrain.core import rules

    config = load_config(overrides=["train.compile=reduce-overhead", "train.grad_accumulation=2"], framework="torch")
    assert rules.refusal(config, rules.World(2, gpu=False, environ={})) is None  # no CUDA graphs on the CPU
    assert "CUDA graphs" in rules.refusal(config, rules.World(2, gpu=True, environ={}))
    default = load_config(overrides=["train.compile=default", "train.grad_accumulation=2"], framework="torch")
    assert rules.refusal(default, rules.World(2, gpu=True, environ={})) is None


def test_the_first_step_is_timed_and_reported_once_on_rank_0():
    out = io.StringIO()
    clock = FirstStepClock("what", rank=0, stream=out)
    for _ in range(3):
        clock.start()
        clock.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdtrain: compiled the step in ") and lines[0].endswith("s (what)")
    assert clock.seconds is not None and clock.seconds >= 0
    quiet = io.StringIO()
    other = FirstStepClock("what", rank=1, stream=quiet)
    other.start()
    other.stop()
    eager = FirstStepClock(stream=quiet)  # an eager step never reports
    eager.start()
    eager.stop()
    assert quiet.getvalue() == "" and other.seconds is not None and eager.seconds is None


def test_torch_compiles_a_module_that_shares_the_models_parameters_and_keys(monkeypatch):
    torch = pytest.importorskip("torch")
    isolate_environ(monkeypatch, ["TORCHINDUCTOR_CACHE_DIR"])  # torch.compile sets its cache folder
    from hvdtrain.torch.compiled import step_module

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    assert step_module(model, "none") is model
    compiled = step_module(model, "default")
    assert compiled is not model and compiled._orig_mod is model  # the model itself is what is saved
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                        "1.running_var", "1.num_batches_tracked"]
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    with pytest.raises(ValueError, match="train.compile: 'fast'"):
        step_module(model, "fast")

