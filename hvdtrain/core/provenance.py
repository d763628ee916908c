"""Which config keys the user set: what a rule that never overrides the user's objects needs to know.

:func:`hvdtrain.core.resolve.load_config` records the dotted keys given by the recipe's defaults,
the config file, the arguments and the overrides (``config.explicit_keys``); a key whose value is
not its default was set too, also in a config built without that record.
"""

from __future__ import annotations

from typing import Any


def user_set(config: Any, key: str) -> bool:
    """Whether the dotted ``key`` (``section.name``) of ``config`` was set by the user."""
    recorded = getattr(config, "__dict__", {}).get("explicit_keys") or ()
    if key in recorded:
        return True
    section, name = key.split(".", 1)
    values = getattr(config, section)
    return getattr(values, name) != getattr(type(values)(), name)
