"""hvdtrain.run's config resolution: the CLI's objects and rules, checked before any worker starts.
(Workers, results and failures are exercised for real in tests/distributed/test_api.py and the
notebook test.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import hvdtrain
from hvdtrain.api import resolve_config


def test_keywords_dicts_and_strings_like_the_cli(tmp_path):
    file = tmp_path / "run.yaml"
    file.write_text("train: {epochs: 5, batch_size: 16}\noptim: {lr: 0.5}\n")
    config = resolve_config("image-classification", "tensorflow", config_file=file, output="rel/out",
                            train__epochs=2, overrides={"optim.lr": 0.25, "data.max_train_samples": 100})
    assert (config.recipe, config.framework) == ("image-classification", "tensorflow")
    assert (config.train.epochs, config.train.batch_size, config.optim.lr) == (2, 16, 0.25)
    assert config.data.max_train_samples == 100
    assert config.optim.warmup_epochs == 0.2  # the recipe's default
    assert Path(config.output).is_absolute() and config.output.endswith("rel/out")
    strings = resolve_config("image-classification", overrides=["train.epochs=3", "train.tensorboard=false"])
    assert strings.train.epochs == 3 and strings.train.tensorboard is False and strings.framework == "torch"


def test_a_run_config_is_taken_as_is_plus_overrides():
    base = hvdtrain.load_config(hvdtrain.get_recipe("image-classification").defaults, recipe="image-classification",
                                framework="tensorflow", train__epochs=4)
    config = resolve_config(base, train__batch_size=8)
    assert (config.framework, config.train.epochs, config.train.batch_size) == ("tensorflow", 4, 8)
    assert base.train.batch_size == 64  # the caller's object is not changed


@pytest.mark.parametrize("kwargs,error,needle", [
    ({"train__epochz": 1}, hvdtrain.ConfigError, "unknown config key train.epochz"),
    ({"overrides": {"optim.decay": "step"}}, hvdtrain.ConfigError, "cosine, linear, constant"),
    ({"np": 0}, ValueError, "np=0"),
])
def test_bad_input_fails_before_any_worker_starts(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        hvdtrain.run("image-classification", **{"np": 2, **kwargs})


def test_unknown_recipe_names_the_known_ones():
    with pytest.raises(hvdtrain.RecipeError, match="unknown recipe 'nope'.*image-classification"):
        hvdtrain.run("nope", np=2)
