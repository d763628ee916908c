"""Issue 41, item 7: config spellings never change values silently.

Before (PyYAML's YAML 1.1 reading): ``--set train.epochs=010`` gave 8, ``1:30`` gave 90,
``train.seed=0123`` gave 83, ``log.run_name=1.10`` became ``'1.1'``, ``data.path=0755`` became
``'493'``; a YAML file with a section twice silently dropped the first block, a duplicated key kept
the last; ``train.seed=4294967296`` passed the check and failed later without naming the key.
"""

from __future__ import annotations

import pytest

from hvdtrain.core.config import ConfigError
from hvdtrain.core.resolve import load_config


@pytest.mark.parametrize("override, key, value", [
    ("train.epochs=010", "train.epochs", 10),
    ("train.seed=0123", "train.seed", 123),
    ("train.epochs=0x10", "train.epochs", 16),
    ("log.run_name=1.10", "log.run_name", "1.10"),
    ("data.path=0755", "data.path", "0755"),
    ("log.run_name=2020-01-01", "log.run_name", "2020-01-01"),
    ("log.run_name=yes", "log.run_name", "yes"),
    ("log.run_name=1e3", "log.run_name", "1e3"),
    ("data.shuffle=no", "data.shuffle", False),
    ("optim.lr=1e-3", "optim.lr", 0.001),
])
def test_set_reads_values_as_yaml_1_2(override, key, value):
    section, name = key.split(".")
    got = getattr(getattr(load_config(overrides=[override]), section), name)
    assert got == value and type(got) is type(value), (override, got)


def test_a_sexagesimal_number_is_refused_not_read_as_minutes():
    with pytest.raises(ConfigError, match=r"train.epochs: expected an integer, got '1:30'"):
        load_config(overrides=["train.epochs=1:30"])


def test_files_read_the_same_way(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  epochs: 010\n  seed: 0123\nlog:\n  run_name: 1.10\ndata:\n  path: 0755\n")
    config = load_config(file=path)
    assert (config.train.epochs, config.train.seed, config.log.run_name, config.data.path) == (10, 123, "1.10", "0755")


@pytest.mark.parametrize("name, text, needle", [
    ("c.yaml", "train:\n  batch_size: 16\nlog:\n  log_dir: x\ntrain:\n  epochs: 2\n",
     "line 5, column 1: duplicate key 'train' (first given at line 1)"),
    ("c.yaml", "train:\n  epochs: 2\n  epochs: 3\n", "line 3, column 3: duplicate key 'epochs' (first given at line 2)"),
    ("c.yml", "train: {epochs: 2, epochs: 3}\n", "duplicate key 'epochs'"),
    ("c.json", '{"train": {"epochs": 2}, "train": {"batch_size": 16}}', "duplicate key 'train'"),
    ("c.json", '{"train": {"epochs": 2, "epochs": 3}}', "duplicate key 'epochs'"),
])
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(file=path)
    message = str(caught.value)
    assert message.startswith(f"config file {path}: ") and needle in message and "\n" not in message, message


def test_merge_keys_still_override_without_being_duplicates(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  <<: {epochs: 2, batch_size: 8}\n  batch_size: 4\n")
    config = load_config(file=path)
    assert (config.train.epochs, config.train.batch_size) == (2, 4)


@pytest.mark.parametrize("seed", ["4294967296", "99999999999999999999", "-1"])
def test_the_seed_is_bounded_by_what_the_frameworks_accept(seed):
    with pytest.raises(ConfigError, match=rf"train.seed: {seed} is out of range"):
        load_config(overrides=[f"train.seed={seed}"])
    assert load_config(overrides=["train.seed=4294967295"]).train.seed == 2**32 - 1
