"""hvdtrain.core.config: loading, precedence, typed overrides and error messages."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from hvdtrain.core.config import (FRAMEWORKS, CheckpointConfig, ConfigError, DataConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig, dump_yaml, parse_override, read_file, to_dict, validate)
from hvdtrain.core.resolve import load_config

SECTIONS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "train": TrainConfig,
            "checkpoint": CheckpointConfig}
TOP_KEYS = [f.name for f in dataclasses.fields(RunConfig) if f.name != "sections"]  # + the recipe's own


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _assert_mentions(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} not in error message {message!r}"


# --------------------------------------------------------------------------- loading


def test_defaults_load():
    config = load_config()
    assert isinstance(config, RunConfig)
    assert dataclasses.replace(config, sections={}) == RunConfig()
    assert set(config.sections) == {"image"}  # the default recipe's own section
    assert config.recipe == "image-classification"
    assert config.framework == "torch"
    assert config.train.epochs == 1
    assert config.train.batch_size == 64
    assert config.train.fp16_allreduce is False
    assert config.optim.name == "sgd"
    assert config.optim.lr == pytest.approx(0.01)
    assert config.data.remainder == "pad"
    assert config.data.max_train_samples is None
    assert config.checkpoint.keep_last == 3


def test_every_default_passes_validation():
    assert validate(RunConfig()) == RunConfig()


YAML_TEXT = """\
framework: tensorflow
output: runs/yaml
train:
  epochs: 4
  batch_size: 32
  fp16_allreduce: true
optim:
  name: adam
  lr: 0.002
data:
  max_train_samples: 100
  max_val_samples: null
  remainder: drop
"""

TOML_TEXT = """\
framework = "tensorflow"
output = "runs/toml"

[train]
epochs = 4
batch_size = 32
fp16_allreduce = true

[optim]
name = "adam"
lr = 0.002

[data]
max_train_samples = 100
remainder = "drop"
"""


def _check_file_config(config: RunConfig, output: str) -> None:
    assert config.framework == "tensorflow"
    assert config.output == output
    assert config.train.epochs == 4 and isinstance(config.train.epochs, int)
    assert config.train.batch_size == 32
    assert config.train.fp16_allreduce is True
    assert config.optim.name == "adam"
    assert config.optim.lr == pytest.approx(0.002) and isinstance(config.optim.lr, float)
    assert config.data.max_train_samples == 100
    assert config.data.max_val_samples is None
    assert config.data.remainder == "drop"
    # untouched keys keep their dataclass defaults
    assert config.train.seed == TrainConfig().seed
    assert config.optim.momentum == OptimConfig().momentum


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_yaml_file_loads(tmp_path, suffix):
    path = tmp_path / f"run{suffix}"
    path.write_text(YAML_TEXT)
    _check_file_config(load_config(file=path), "runs/yaml")
    _check_file_config(load_config(file=str(path)), "runs/yaml")


def test_toml_file_loads(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(TOML_TEXT)
    _check_file_config(load_config(file=path), "runs/toml")


def test_empty_yaml_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert dataclasses.replace(load_config(file=path), sections={}) == RunConfig()


def test_precedence_defaults_recipe_file_keywords_overrides(tmp_path):
    recipe_defaults = {"train": {"epochs": 2, "batch_size": 16, "seed": 5, "log_every": 7},
                       "optim": {"lr": 0.5}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"train": {"epochs": 3, "batch_size": 32, "seed": 6},
                                    "optim": {"momentum": 0.5}}))
    config = load_config(copy.deepcopy(recipe_defaults), file=path,
                         overrides=["train.epochs=5"],
                         train__epochs=4, train__batch_size=48, train__seed=None, framework="tensorflow")
    assert config.train.epochs == 5            # --set beats keyword, file and recipe
    assert config.train.batch_size == 48       # keyword beats file and recipe
    assert config.train.seed == 6              # keyword None is skipped: file beats recipe
    assert config.train.log_every == 7         # recipe default beats dataclass default
    assert config.train.grad_accumulation == 1  # dataclass default
    assert config.optim.lr == pytest.approx(0.5)       # recipe section merged with file section
    assert config.optim.momentum == pytest.approx(0.5)  # file
    assert config.optim.name == "sgd"
    assert config.framework == "tensorflow"    # top-level keyword


def test_each_layer_alone_beats_the_one_below(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nepochs = 3\n")
    assert load_config().train.epochs == 1
    assert load_config({"train": {"epochs": 2}}).train.epochs == 2
    assert load_config({"train": {"epochs": 2}}, file=path).train.epochs == 3
    assert load_config({"train": {"epochs": 2}}, file=path, train__epochs=4).train.epochs == 4
    assert load_config({"train": {"epochs": 2}}, file=path, overrides=["train.epochs=5"],
                       train__epochs=4).train.epochs == 5


def test_later_override_wins():
    config = load_config(overrides=["train.epochs=2", "train.epochs=9"])
    assert config.train.epochs == 9


def test_load_config_does_not_mutate_defaults():
    defaults = {"train": {"epochs": 2}}
    snapshot = copy.deepcopy(defaults)
    load_config(defaults, overrides=["train.batch_size=8", "train.epochs=7"], train__seed=3)
    assert defaults == snapshot
    assert load_config(defaults).train.epochs == 2


# --------------------------------------------------------------------------- typed overrides


@pytest.mark.parametrize("text, key, value", [
    ("train.epochs=3", "train.epochs", 3),
    ("optim.lr=0.1", "optim.lr", 0.1),
    ("train.fp16_allreduce=true", "train.fp16_allreduce", True),
    ("train.fp16_allreduce=false", "train.fp16_allreduce", False),
    ("data.max_train_samples=null", "data.max_train_samples", None),
    ("data.max_train_samples=~", "data.max_train_samples", None),
    ("data.path=/data/imagenet", "data.path", "/data/imagenet"),
    ("  data.path =a=b", "data.path", "a=b"),
    ("data.path=", "data.path", ""),
])
def test_parse_override_types_values_via_yaml(text, key, value):
    got_key, got_value = parse_override(text)
    assert got_key == key
    assert got_value == value
    # a number read from YAML is an int/float subclass that keeps the text it was written as
    assert type(got_value) is type(value) or (type(value) in (int, float) and type(got_value).__base__ is type(value))


@pytest.mark.parametrize("override, section, key, value", [
    ("train.epochs=3", "train", "epochs", 3),
    ("optim.lr=0.25", "optim", "lr", 0.25),
    ("optim.lr=1e-3", "optim", "lr", 1e-3),  # PyYAML reads 1e-3 as a string; the float field converts it
    ("optim.warmup_epochs=2", "optim", "warmup_epochs", 2.0),
    ("train.fp16_allreduce=true", "train", "fp16_allreduce", True),
    ("checkpoint.resume=yes", "checkpoint", "resume", True),
    ("data.shuffle=false", "data", "shuffle", False),
    ("train.threads=null", "train", "threads", None),
    ("data.augment=null", "image", "augment", None),  # old spelling of image.augment
    ("data.augment=true", "image", "augment", True),
    ("image.augment=false", "image", "augment", False),
    ("optim.grad_clip_norm=1.5", "optim", "grad_clip_norm", 1.5),
    ("model.name=resnet18", "model", "name", "resnet18"),
])
def test_set_values_are_typed(override, section, key, value):
    got = getattr(getattr(load_config(overrides=[override]), section), key)
    assert got == value
    assert type(got) is type(value)


def test_int_given_for_float_field_becomes_float():
    config = load_config(overrides=["optim.lr=1"])
    assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)


@pytest.mark.parametrize("value", [1, 1000, None])
def test_max_samples_accept_positive_ints_and_null(value):
    text = "null" if value is None else str(value)
    config = load_config(overrides=[f"data.max_train_samples={text}", f"data.max_val_samples={text}"])
    assert config.data.max_train_samples == value
    assert config.data.max_val_samples == value


@pytest.mark.parametrize("key", ["data.max_train_samples", "data.max_val_samples"])
@pytest.mark.parametrize("bad", ["0", "-5", "abc", "2.5"])
def test_max_samples_reject_non_positive_and_non_int(key, bad):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{key}={bad}"])
    _assert_mentions(str(err.value), key)


@pytest.mark.parametrize("override", [
    "optim.momentum=1.0", "optim.momentum=0", "optim.lr=1e-9", "train.log_every=0", "optim.min_lr_ratio=1",
    "optim.min_lr_ratio=0", "train.epochs=1", "data.prefetch_batches=0", "data.image_size=8",
    "model.num_classes=2", "train.seed=0",
])
def test_boundary_values_are_accepted(override):
    load_config(overrides=[override])


# --------------------------------------------------------------------------- errors


def test_unknown_top_level_key_lists_allowed_keys():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["bogus=1"])
    _assert_mentions(str(err.value), "bogus", *TOP_KEYS)


def test_unknown_top_level_keyword_is_rejected():
    with pytest.raises(ConfigError) as err:
        load_config(trian__epochs=2)
    _assert_mentions(str(err.value), "trian", *TOP_KEYS)


@pytest.mark.parametrize("section, cls", sorted(SECTIONS.items()))
def test_unknown_nested_key_lists_allowed_keys_of_that_section(section, cls):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{section}.no_such_key=1"])
    message = str(err.value)
    _assert_mentions(message, f"{section}.no_such_key", f"allowed keys in {section}:")
    listed = message.split(f"allowed keys in {section}:", 1)[1]
    assert [name.strip() for name in listed.split(",")] == _names(cls)


def test_unknown_nested_key_in_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  epoch: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(file=path)
    _assert_mentions(str(err.value), "train.epoch", *_names(TrainConfig))


@pytest.mark.parametrize("override, key, choices", [
    ("optim.name=rmsprop", "optim.name", ("sgd", "adam", "adamw")),
    ("optim.decay=step", "optim.decay", ("cosine", "linear", "constant")),
    ("optim.lr_scaling=cubic", "optim.lr_scaling", ("linear", "sqrt", "none")),
    ("data.remainder=keep", "data.remainder", ("pad", "drop")),
    ("train.mixed_precision=fp8", "train.mixed_precision", ("none", "bf16", "fp16")),
    ("framework=jax", "framework", FRAMEWORKS),
])
def test_bad_choice_lists_choices(override, key, choices):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    bad = override.split("=", 1)[1]
    _assert_mentions(str(err.value), key, bad, *choices)


@pytest.mark.parametrize("override, key, bound", [
    ("train.epochs=0", "train.epochs", ">= 1"),
    ("train.batch_size=-4", "train.batch_size", ">= 1"),
    ("optim.momentum=1.5", "optim.momentum", "<= 1.0"),
    ("optim.momentum=-0.1", "optim.momentum", ">= 0.0"),
    ("optim.lr=0", "optim.lr", "> 0.0"),
    ("optim.lr=-0.1", "optim.lr", "> 0.0"),
    ("optim.min_lr_ratio=2", "optim.min_lr_ratio", "<= 1.0"),
    ("optim.grad_clip_norm=0", "optim.grad_clip_norm", "> 0.0"),
    ("data.image_size=4", "image.size", ">= 8"),
    ("model.num_classes=1", "model.num_classes", ">= 2"),
    ("checkpoint.keep_last=0", "checkpoint.keep_last", ">= 1"),
])
def test_out_of_range_names_key_value_and_bound(override, key, bound):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    bad = override.split("=", 1)[1]
    _assert_mentions(str(err.value), key, bad, bound, "out of range")


def test_exclusive_minimum_says_strictly_greater():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["optim.lr=0"])
    assert ">= 0" not in str(err.value)


@pytest.mark.parametrize("override, key, expected", [
    ("train.epochs=abc", "train.epochs", "integer"),
    ("train.epochs=2.5", "train.epochs", "integer"),
    ("train.epochs=true", "train.epochs", "integer"),
    ("train.fp16_allreduce=maybe", "train.fp16_allreduce", "true or false"),
    ("train.fp16_allreduce=2", "train.fp16_allreduce", "true or false"),
    ("optim.lr=fast", "optim.lr", "number"),
    ("optim.lr=true", "optim.lr", "number"),
    ("model.name=[a, b]", "model.name", "string"),
    ("train.epochs=null", "train.epochs", "integer"),
])
def test_wrong_type_names_key_and_value(override, key, expected):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    bad = override.split("=", 1)[1]
    _assert_mentions(str(err.value), key, expected)
    if bad not in ("null", "[a, b]"):
        _assert_mentions(str(err.value).lower(), bad.lower())


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_section_given_a_scalar(section):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{section}=5"])
    _assert_mentions(str(err.value), section, "mapping", "5")


def test_section_given_a_scalar_in_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optim: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(file=path)
    _assert_mentions(str(err.value), "optim", "mapping")


def test_override_below_a_value_is_rejected():
    with pytest.raises(ConfigError) as err:
        load_config({"train": {"epochs": 2}}, overrides=["train.epochs.x=1"])
    _assert_mentions(str(err.value), "train.epochs.x", "epochs", "not a section")


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(file=path)
    _assert_mentions(str(err.value), str(path), "does not exist")


def test_directory_is_not_a_config_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_file(tmp_path)
    _assert_mentions(str(err.value), str(tmp_path))


@pytest.mark.parametrize("name", ["run.ini", "run.cfg", "run"])
def test_unknown_file_extension(tmp_path, name):
    path = tmp_path / name
    path.write_text("train:\n  epochs: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(file=path)
    message = str(err.value)
    _assert_mentions(message, str(path), ".yaml", ".yml", ".toml")
    if path.suffix:
        _assert_mentions(message, path.suffix)


@pytest.mark.parametrize("name, text", [
    ("bad.yaml", "train: [1, 2\n"),
    ("bad.toml", "[train\nepochs = 2\n"),
])
def test_syntax_error_in_file_names_the_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(file=path)
    _assert_mentions(str(err.value), str(path))


def test_file_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(file=path)
    _assert_mentions(str(err.value), str(path), "mapping")


@pytest.mark.parametrize("text", ["train.epochs", "train.epochs 3", ""])
def test_override_without_equals(text):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[text])
    _assert_mentions(str(err.value), repr(text), "section.key=value")


def test_override_with_empty_key():
    with pytest.raises(ConfigError) as err:
        parse_override("=3")
    _assert_mentions(str(err.value), "'=3'", "empty key")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_validate_rechecks_a_modified_config():
    config = load_config()
    config.train.epochs = 0
    with pytest.raises(ConfigError, match=r"train\.epochs"):
        validate(config)
    config.train.epochs = 2
    config.optim.name = "lamb"
    with pytest.raises(ConfigError, match=r"optim\.name.*lamb"):
        validate(config)


# --------------------------------------------------------------------------- dump / round trip


def _non_default_config() -> RunConfig:
    return load_config(
        {"model": {"name": "resnet18", "num_classes": 10}},
        overrides=["train.epochs=7", "optim.lr=0.125", "optim.decay=linear", "optim.grad_clip_norm=2.5",
                   "data.max_train_samples=500", "data.augment=false", "train.fp16_allreduce=true",
                   "data.path=/data/x", "checkpoint.keep_last=1", "train.threads=3"],
        framework="tensorflow", output="runs/roundtrip")


def test_dump_yaml_round_trips_through_a_file(tmp_path):
    config = _non_default_config()
    assert config != RunConfig()
    text = dump_yaml(config)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    again = load_config(file=path)
    assert again == config
    assert dump_yaml(again) == text


def test_dump_yaml_round_trips_as_defaults():
    config = _non_default_config()
    assert load_config(yaml.safe_load(dump_yaml(config))) == config


def test_dump_yaml_is_plain_nested_yaml():
    config = _non_default_config()
    data = yaml.safe_load(dump_yaml(config))
    assert data == to_dict(config)
    assert list(data) == TOP_KEYS + ["image"]  # the image-classification recipe's own section comes last
    assert data["train"]["epochs"] == 7
    assert data["image"]["augment"] is False
    assert data["model"]["num_classes"] == 10


@pytest.mark.parametrize("override", ["optim.lr=.nan", "optim.momentum=nan", "optim.min_lr_ratio=.nan"])
def test_nan_is_out_of_range(override):
    with pytest.raises(ConfigError):
        load_config(overrides=[override])
