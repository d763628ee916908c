"""A run's config resolved the way every entry point needs it: the recipe's own sections from the
registry, then the rulebook's verdict.

:mod:`hvdtrain.core.config` knows no recipe and no rule that spans sections; this module joins it
to the recipe registry (:func:`hvdtrain.core.registry.config_schema`) and to the rulebook
(:mod:`hvdtrain.core.rules`). The CLI, :func:`hvdtrain.run` and tests call :func:`load_config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hvdtrain.core import config as _config
from hvdtrain.core import rules
from hvdtrain.core.registry import config_schema


def load_config(defaults: dict[str, Any] | None = None, file: str | Path | None = None,
                overrides: list[str] | tuple[str, ...] = (), **top: Any) -> _config.RunConfig:
    """Resolve a :class:`~hvdtrain.core.config.RunConfig` (dataclass defaults < recipe ``defaults``
    < ``file`` < ``top`` < ``overrides``; see :func:`hvdtrain.core.config.load_config`) with the
    sections of the recipe in force, and refuse a combination the rulebook refuses."""
    config = _config.load_config(defaults, file, overrides, schema=config_schema, **top)
    # the train.* keys the user gave (not the recipe's defaults): where train.batch_size is not one of
    # them, a fixed global batch sets the micro-batch (hvdtrain.core.batching.given)
    config.train.given_keys = frozenset(key.split(".", 1)[1] for key in given_keys(None, file, overrides, top)
                                        if key.startswith("train."))
    rules.check(config)
    # what the user set, for the rule that optim.* defaults never touch the task's own optimizer
    # (hvdtrain.core.optimizer_policy): an instance attribute, carried where the config is pickled
    config.explicit_keys = frozenset(given_keys(defaults, file, overrides, top))
    return config


def given_keys(defaults: dict[str, Any] | None, file: str | Path | None, overrides: list[str] | tuple[str, ...],
               top: dict[str, Any]) -> set[str]:
    """The dotted keys set by the recipe's ``defaults``, the config ``file``, ``top`` (None values
    skipped) and the ``overrides``."""
    keys: set[str] = set()

    def walk(data: Any, prefix: str) -> None:
        for key, value in (data or {}).items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, dotted + ".")
            else:
                keys.add(dotted)

    walk(defaults, "")
    if file:
        walk(_config.read_file(file), "")
    keys.update(key.replace("__", ".") for key, value in top.items() if value is not None)
    keys.update(_config.parse_override(text)[0] for text in overrides)
    return keys

