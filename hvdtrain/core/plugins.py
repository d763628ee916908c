"""Recipes from outside hvdtrain: a user's recipe file, and installed packages' entry points.

* ``hvdtrain recipe path/to/my_recipe.py`` (or ``hvdtrain.run("path/to/my_recipe.py")``) imports
  that file, which registers its recipe with :func:`hvdtrain.register_recipe`; ``file.py:name``
  picks one recipe when the file defines several.
* An installed package adds recipes through the ``hvdtrain.recipes`` entry-point group, e.g. in
  its ``setup.cfg``::

      [options.entry_points]
      hvdtrain.recipes =
          my-task = my_package.recipes

  The entry point's name is the recipe's name; loading it imports the module (which registers the
  recipe), or registers the :class:`~hvdtrain.core.registry.RecipeSpec` it points at. A package
  that fails to load is skipped with a warning, and asking for its recipe repeats the reason.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from pathlib import Path

from hvdtrain.core import registry
from hvdtrain.core.registry import load_entry_point_recipes

_loaded_files: dict[Path, list[str]] = {}


def is_recipe_file(text: str) -> bool:
    """True if ``text`` names a Python file (``x.py`` or ``x.py:recipe``) rather than a recipe name."""
    return text.split(":", 1)[0].endswith(".py")


def _snapshot() -> dict[str, tuple[int, frozenset]]:
    return {name: (id(spec), frozenset(spec.builders.items())) for name, spec in registry._RECIPES.items()}


def load_recipe_file(path: str | Path) -> list[str]:
    """Import the recipe file ``path`` (once per process) and return the recipe names it registered.

    The file's folder goes on ``sys.path`` (so it can import its neighbours), and its functions are
    pickled by value, so :func:`hvdtrain.run` can ship them to workers that cannot import the file.
    """
    file = Path(path).expanduser().resolve()
    if file in _loaded_files:
        return _loaded_files[file]
    if not file.is_file():
        raise registry.RecipeError(f"recipe file {path} does not exist")
    load_entry_point_recipes()
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:8]
    module_name = f"hvdtrain_user_recipe_{file.stem.replace('-', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    before = _snapshot()
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise registry.RecipeError(f"recipe file {path} failed to load: {type(exc).__name__}: {exc} "
                                   f"(at {where.filename}:{where.lineno})") from exc
    after = _snapshot()
    names = sorted(name for name, state in after.items() if before.get(name) != state)
    if not names:
        raise registry.RecipeError(f"recipe file {path} registered no recipe; decorate a builder with "
                                   f"@hvdtrain.register_recipe(\"my-task\", framework=\"torch\")")
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    _loaded_files[file] = names
    return names


def resolve_recipe_name(text: str) -> str:
    """A recipe name as given, or the recipe registered by the file ``x.py`` / ``x.py:name``."""
    if not is_recipe_file(text):
        return text
    path, _, wanted = text.partition(":")
    names = load_recipe_file(path)
    if wanted:
        if wanted not in names:
            raise registry.RecipeError(f"recipe file {path} defines no recipe {wanted!r}; it defines: "
                                       f"{', '.join(names)}")
        return wanted
    if len(names) > 1:
        raise registry.RecipeError(f"recipe file {path} defines several recipes ({', '.join(names)}); "
                                   f"pick one with {path}:NAME")
    return names[0]
