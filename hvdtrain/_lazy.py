"""A package's public names, imported from their modules on first use (PEP 562).

``hvdtrain`` and ``hvdtrain.data`` export names this way, so that importing them loads none of
their modules: a process that needs a part (a decoding worker, config code) pays only for it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable


def exports(package: str, modules: dict[str, list[str]]) -> tuple[Callable, Callable, list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, whose public names live in ``modules``
    (module name -> its names): a name is imported from its module when first asked for, then is
    an ordinary attribute of the package."""
    module_of = {name: module for module, names in modules.items() for name in names}
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str):
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(module), name)
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *module_of})

    return __getattr__, __dir__, sorted(module_of)
