"""Recipe-owned config sections: a user's recipe declares its own section (help, choices, range),
set from --set and from YAML/TOML, validated in the same pass; moved keys keep their old spelling."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

import hvdtrain
from hvdtrain.core.config import ConfigError, describe_keys, to_dict
from hvdtrain.core.resolve import load_config
from hvdtrain.core.registry import define_recipe, unregister_recipe

NAME = "test-sections-recipe"


@dataclass
class AudioConfig:
    """A user's own section."""

    sample_rate: int = hvdtrain.option(16000, "samples per second", min=8000, max=48000)
    window: str = hvdtrain.option("hann", "analysis window", choices=("hann", "hamming"))
    labels: str | None = hvdtrain.option(None, "labels file")
    clip_seconds: float = hvdtrain.option(5.0, "length of each training clip", min=0.1, resume="data")


@pytest.fixture
def recipe():
    spec = define_recipe(NAME, defaults={"audio": {"window": "hamming"}}, sections={"audio": AudioConfig},
                         moved_keys={"data.sample_rate": "audio.sample_rate"}, replace=True)
    yield spec
    unregister_recipe(NAME)


def test_section_defaults_and_set(recipe):
    config = load_config(recipe.defaults, recipe=NAME)
    assert config.audio == AudioConfig(window="hamming")
    config = load_config(recipe.defaults, overrides=["audio.sample_rate=22050", "audio.labels=l.csv"], recipe=NAME)
    assert (config.audio.sample_rate, config.audio.window, config.audio.labels) == (22050, "hamming", "l.csv")
    assert to_dict(config)["audio"]["sample_rate"] == 22050


def test_section_from_yaml_and_toml(recipe, tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"recipe: {NAME}\naudio:\n  sample_rate: 44100\n  window: hann\n")
    config = load_config(recipe.defaults, yaml_file)
    assert (config.audio.sample_rate, config.audio.window) == (44100, "hann")
    toml_file = tmp_path / "c.toml"
    toml_file.write_text(f'recipe = "{NAME}"\n[audio]\nsample_rate = 8000\n')
    assert load_config(recipe.defaults, toml_file).audio.sample_rate == 8000


@pytest.mark.parametrize("override, expected", [
    ("audio.sample_rate=100", "audio.sample_rate: 100 is out of range"),
    ("audio.window=box", "audio.window: 'box' is not allowed; choose one of: hann, hamming"),
    ("audio.nope=1", "unknown config key audio.nope; allowed keys in audio: sample_rate, window, labels"),
    ("audio.sample_rate=fast", "audio.sample_rate: expected an integer"),
])
def test_section_values_validated_in_the_same_pass(recipe, override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(recipe.defaults, overrides=[override], recipe=NAME)
    assert expected in str(err.value)


def test_section_of_another_recipe_is_named(recipe):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["audio.window=hann"])  # the default recipe, image-classification
    assert f"a section of recipe {NAME}" in str(err.value)


def test_moved_key_keeps_working_with_a_note(recipe):
    config = load_config(recipe.defaults, overrides=["data.sample_rate=32000"], recipe=NAME)
    assert config.audio.sample_rate == 32000
    assert config.notes == ("data.sample_rate is now audio.sample_rate (a key of recipe test-sections-recipe); "
                            "the old spelling still works",)  # rank 0 prints it as the run begins


def test_image_recipe_old_keys_still_accepted():
    config = load_config(overrides=["data.image_size=32", "data.augment=false", "data.bad_files=skip"])
    assert (config.image.size, config.image.augment, config.image.bad_files) == (32, False, "skip")
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["data.image_size=4"])
    assert "image.size: 4 is out of range" in str(err.value)


def test_bert_text_section_is_the_recipes():
    spec = hvdtrain.get_recipe("bert-finetune")
    config = load_config(spec.defaults, recipe="bert-finetune", overrides=["text.max_length=32"])
    assert config.text.max_length == 32 and "image" not in config.sections
    with pytest.raises(ConfigError) as err:
        load_config(spec.defaults, recipe="bert-finetune", overrides=["data.image_size=32"])
    assert "moved to image.size, a key of recipe image-classification" in str(err.value)


def test_describe_keys_lists_sections(recipe):
    rows = {key: (value, text) for key, value, text in describe_keys(load_config(recipe.defaults, recipe=NAME))}
    assert rows["audio.sample_rate"] == (16000, "samples per second [>= 8000, <= 48000]")
    assert rows["audio.window"][1] == "analysis window [hann, hamming]"
    assert "train.epochs" in rows


USER_RECIPE = '''
"""A user recipe file with its own section."""
from dataclasses import dataclass
import hvdtrain

@dataclass
class ToyConfig:
    """Toy knobs."""
    width: int = hvdtrain.option(4, "hidden width", min=1)

hvdtrain.define_recipe("toy-sections", sections={"toy": ToyConfig})

@hvdtrain.register_recipe("toy-sections", framework="torch")
def build(config, ctx):
    raise NotImplementedError
'''


def test_cli_lists_a_user_recipes_keys(tmp_path):
    path = tmp_path / "toy_recipe.py"
    path.write_text(textwrap.dedent(USER_RECIPE))
    (tmp_path / "c.yaml").write_text("toy:\n  width: 9\n")
    cmd = [sys.executable, "-c", "from hvdtrain.cli import main; main()", "recipe", str(path), "--keys"]
    out = subprocess.run(cmd + ["--set", "toy.width=7"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "* toy.width = 7" in out.stdout and "hidden width [>= 1]" in out.stdout
    out = subprocess.run(cmd + ["--config", str(tmp_path / "c.yaml")], capture_output=True, text=True)
    assert "* toy.width = 9" in out.stdout, out.stderr
    bad = subprocess.run(cmd + ["--set", "toy.width=0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "toy.width: 0 is out of range" in bad.stderr


def test_a_recipe_key_declared_resume_data_is_refused_on_resume_naming_it(recipe, tmp_path):
    """``option(..., resume="data")`` puts a recipe's own key beside the core's data-order keys:
    ``--resume`` with another value is refused naming it (the saved position would mean other
    samples); keys without it may change."""
    from hvdtrain.core.checkpoint import CheckpointInfo
    from hvdtrain.core.config import resume_keys
    from hvdtrain.core.resume import incompatibility

    saved = load_config(recipe.defaults, recipe=NAME, framework="torch")
    assert ("audio.clip_seconds", "data") in resume_keys(saved) and ("train.seed", "data") in resume_keys(saved)
    info = CheckpointInfo(tmp_path / "epoch-0001", {"recipe": NAME, "framework": "torch", "config": to_dict(saved)})
    assert incompatibility(info, load_config(recipe.defaults, overrides=["audio.sample_rate=22050"], recipe=NAME,
                                             framework="torch")) is None
    why = incompatibility(info, load_config(recipe.defaults, overrides=["audio.clip_seconds=2.5"], recipe=NAME,
                                            framework="torch"))
    assert why and "audio.clip_seconds=5.0" in why and "audio.clip_seconds=2.5" in why and "skip or repeat" in why
