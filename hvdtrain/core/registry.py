"""Recipe registry: a recipe is a name, defaults, and one builder function per framework.

Recipes register themselves (``@register_recipe("name", framework="torch")``); the CLI and the
Python API look them up with :func:`get_builder`. A duplicate registration or an unknown name or
framework is a :class:`RecipeError` naming what is known.

The library names no recipe module: the recipes shipped with hvdtrain (``hvdtrain_recipes``) are
found like any installed package's, through the ``hvdtrain.recipes`` entry points (declared in
setup.cfg); a user's own recipe comes from a file the user names (:mod:`hvdtrain.core.plugins`).
An editable install made before an entry point was declared does not list it: the entry points
that this checkout's setup.cfg declares are read as well.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hvdtrain.core.config import FRAMEWORKS, Schema

ENTRY_POINT_GROUP = "hvdtrain.recipes"  # installed packages add recipes here (see hvdtrain.core.plugins)
_entry_points_loaded = False
_entry_point_errors: dict[str, str] = {}


class RecipeError(LookupError):
    """An unknown or duplicate recipe or framework."""


@dataclass
class RecipeSpec:
    """One recipe: description, config defaults, and a builder per framework.

    ``sections`` maps the names of the recipe's own config sections to dataclasses whose fields
    are declared with :func:`hvdtrain.core.config.option` (help, choices, range); they are set
    with ``--set name.key=value`` or a file's ``name:`` section and read as ``config.name``.
    ``moved_keys`` maps old spellings of keys that moved into those sections to their new place
    (``{"data.image_size": "image.size"}``); the old spelling keeps working, with a note.

    A builder takes ``(config, ctx)`` (a :class:`~hvdtrain.core.config.RunConfig` and a
    :class:`~hvdtrain.core.adapter.DistContext`) and returns a
    :class:`~hvdtrain.core.task.TrainTask`.
    """

    name: str
    description: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    builders: dict[str, Callable[..., Any]] = field(default_factory=dict)
    sections: dict[str, type] = field(default_factory=dict)
    moved_keys: dict[str, str] = field(default_factory=dict)
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)
    """Named entry points other commands reach through the registry instead of importing the
    recipe: ``bench_model(framework, name, channels, image_size, num_classes)`` for
    ``hvdtrain bench``, ``predict(run_dir, texts)`` for ``hvdtrain predict``."""


_RECIPES: dict[str, RecipeSpec] = {}


def define_recipe(name: str, description: str = "", defaults: dict[str, Any] | None = None,
                  replace: bool = False, sections: dict[str, type] | None = None,
                  moved_keys: dict[str, str] | None = None,
                  hooks: dict[str, Callable[..., Any]] | None = None) -> RecipeSpec:
    """Declare recipe ``name`` with its description, config defaults (a nested dict), its own
    config ``sections`` (name -> dataclass), ``moved_keys`` (old dotted key -> new) and ``hooks``
    (see :class:`RecipeSpec`).

    ``replace=True`` drops an existing recipe of that name first (a notebook cell run twice).
    """
    if name in _RECIPES and not replace:
        raise RecipeError(f"recipe {name!r} is already defined")
    import dataclasses

    for section, cls in (sections or {}).items():
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise RecipeError(f"recipe {name!r}: section {section!r} must be a dataclass, got {cls!r}")
    spec = RecipeSpec(name, description, dict(defaults or {}), sections=dict(sections or {}),
                      moved_keys=dict(moved_keys or {}), hooks=dict(hooks or {}))
    _RECIPES[name] = spec
    return spec


def register_recipe(name: str, framework: str,
                    replace: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a builder of recipe ``name`` for ``framework``.

    The recipe is defined on first use if :func:`define_recipe` was not called. ``replace=True``
    swaps an existing builder for that framework (a notebook cell run twice).
    """
    if framework not in FRAMEWORKS:
        raise RecipeError(f"framework {framework!r} is not supported; choose one of: {', '.join(FRAMEWORKS)}")

    def decorate(builder: Callable[..., Any]) -> Callable[..., Any]:
        spec = _RECIPES.get(name) or define_recipe(name)
        if framework in spec.builders and not replace:
            raise RecipeError(f"recipe {name!r} already has a {framework} builder "
                              f"({spec.builders[framework].__module__}.{spec.builders[framework].__qualname__})")
        spec.builders[framework] = builder
        return builder

    return decorate


def register_spec(spec: RecipeSpec, replace: bool = False) -> RecipeSpec:
    """Register a whole :class:`RecipeSpec` (what :func:`hvdtrain.run` ships to its workers)."""
    if spec.name in _RECIPES and _RECIPES[spec.name] is not spec and not replace:
        raise RecipeError(f"recipe {spec.name!r} is already defined")
    _RECIPES[spec.name] = spec
    return spec


def unregister_recipe(name: str) -> None:
    """Remove recipe ``name`` (mostly for tests and notebooks that redefine a recipe)."""
    _RECIPES.pop(name, None)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    """The ``hvdtrain.recipes`` entry points of the installed distributions, and those this
    checkout's setup.cfg declares that are not installed (an editable install made before they
    were declared)."""
    found = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    setup_cfg = Path(__file__).resolve().parents[2] / "setup.cfg"
    if setup_cfg.is_file():
        parser = configparser.ConfigParser()
        parser.read(setup_cfg)
        known = {ep.name for ep in found}
        for line in parser.get("options.entry_points", ENTRY_POINT_GROUP, fallback="").splitlines():
            name, _, value = (part.strip() for part in line.partition("="))
            if name and value and name not in known:
                found.append(importlib.metadata.EntryPoint(name, value, ENTRY_POINT_GROUP))
    return found


def load_entry_point_recipes() -> None:
    """Import every ``hvdtrain.recipes`` entry point once (the shipped recipes' too; see
    :mod:`hvdtrain.core.plugins`); failures become warnings, and asking for such a recipe repeats
    the reason."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in _entry_points():
        if ep.name in _RECIPES:
            continue
        try:
            loaded = ep.load()
            if isinstance(loaded, RecipeSpec):
                register_spec(loaded)
        except Exception as exc:  # one broken plugin must not break every command
            reason = f"recipe {ep.name!r} from entry point {ep.value!r} ({ENTRY_POINT_GROUP}) " \
                     f"failed to load: {type(exc).__name__}: {exc}"
            _entry_point_errors[ep.name] = reason
            warnings.warn(reason, RuntimeWarning, stacklevel=2)


def entry_point_error(name: str) -> str | None:
    """Why the entry-point recipe ``name`` could not be loaded, if it failed."""
    return _entry_point_errors.get(name)


def list_recipes() -> dict[str, RecipeSpec]:
    """All known recipes by name: from the ``hvdtrain.recipes`` entry points (the shipped recipes
    among them), and registered."""
    load_entry_point_recipes()
    return dict(sorted(_RECIPES.items()))


def get_recipe(name: str) -> RecipeSpec:
    """The recipe called ``name``, or a RecipeError listing the known ones."""
    recipes = list_recipes()
    if name not in recipes:
        known = ", ".join(recipes) or "none"
        raise RecipeError(entry_point_error(name) or f"unknown recipe {name!r}; known recipes: {known}")
    return recipes[name]


def get_builder(name: str, framework: str) -> Callable[..., Any]:
    """The builder of recipe ``name`` for ``framework``, or a RecipeError naming what exists."""
    spec = get_recipe(name)
    if framework not in spec.builders:
        have = ", ".join(sorted(spec.builders)) or "none"
        raise RecipeError(f"recipe {name!r} has no {framework!r} version; available frameworks: {have}")
    return spec.builders[framework]


def recipes_declaring(section: str) -> list[str]:
    """Names of the known recipes that declare config section ``section``."""
    return [name for name, spec in list_recipes().items() if section in spec.sections]


def moved_elsewhere(recipe: str) -> dict[str, tuple[str, str]]:
    """Old key spellings moved by recipes other than ``recipe`` (and not by it): old -> (new, owner)."""
    recipes = list_recipes()
    own = recipes[recipe].moved_keys if recipe in recipes else {}
    return {old: (new, name) for name, spec in recipes.items() if name != recipe
            for old, new in spec.moved_keys.items() if old not in own}


def config_schema(recipe: str) -> Schema:
    """What recipe ``recipe`` adds to the config (:class:`~hvdtrain.core.config.Schema`): its
    sections and moved keys, and what the other known recipes declare (for error messages). A
    recipe not registered (yet) adds nothing."""
    recipes = list_recipes()
    spec = recipes.get(recipe)
    foreign: dict[str, tuple[str, ...]] = {}
    for name, other in recipes.items():
        for section in other.sections:
            if name != recipe:
                foreign[section] = (*foreign.get(section, ()), name)
    return Schema(sections=dict(spec.sections) if spec else {}, moved_keys=dict(spec.moved_keys) if spec else {},
                  foreign_sections=foreign, foreign_moves=moved_elsewhere(recipe))


def get_hook(name: str, hook: str) -> Callable[..., Any]:
    """Entry point ``hook`` of recipe ``name`` (see :class:`RecipeSpec`), or a RecipeError naming
    the recipes that have it."""
    spec = get_recipe(name)
    if hook not in spec.hooks:
        have = ", ".join(n for n, s in list_recipes().items() if hook in s.hooks) or "none"
        raise RecipeError(f"recipe {name!r} provides no {hook!r}; recipes that do: {have}")
    return spec.hooks[hook]
