"""Nested dataclass configuration, loaded from YAML/TOML plus ``--set section.key=value`` overrides.

The public face of three modules, each with one job:

* :mod:`hvdtrain.core.config_schema`: the sections and their keys, each with its default, help
  text and allowed choices or range (:func:`option`); recipes add sections of their own (:class:`Schema`);
* :mod:`hvdtrain.core.config_files`: config files (YAML 1.2, JSON, TOML) and ``--set`` values read
  into plain values;
* :mod:`hvdtrain.core.config_loader`: :func:`load_config` merges defaults, file and overrides and
  :func:`validate` converts and checks every key in one pass, naming the bad key or value
  together with what is allowed.

:class:`ConfigError` (:mod:`hvdtrain.core.config_error`) is what each of them raises.
"""

from __future__ import annotations

from hvdtrain.core.config_error import ConfigError
from hvdtrain.core.config_files import MAX_NESTING, ConfigLoader, parse_override, read_file, read_yaml
from hvdtrain.core.config_loader import dump_yaml, from_dict, load_config, merge, to_dict, validate
from hvdtrain.core.config_schema import (FRAMEWORKS, PREEMPT_SIGNALS, RESUME_KINDS, TRACKER_NAMES, CheckpointConfig,
                                         CommConfig, DataConfig, LogConfig, ModelConfig, OptimConfig, ParallelConfig,
                                         RunConfig, Schema, TrainConfig, describe_keys, option, parse_cut,
                                         preempt_signal_names, resume_keys, section_types, tracker_names)

__all__ = ["FRAMEWORKS", "MAX_NESTING", "PREEMPT_SIGNALS", "RESUME_KINDS", "TRACKER_NAMES", "CheckpointConfig",
           "CommConfig", "ConfigError", "ConfigLoader", "DataConfig", "LogConfig", "ModelConfig", "OptimConfig",
           "ParallelConfig", "RunConfig", "Schema", "TrainConfig", "describe_keys", "dump_yaml", "from_dict",
           "load_config", "merge", "option", "parse_cut", "parse_override", "preempt_signal_names", "read_file",
           "read_yaml", "resume_keys", "section_types", "to_dict", "tracker_names", "validate"]
