"""The config's loader: defaults, files and overrides merged into the schema's dataclasses, every
value converted to its key's type and checked against its choices and range, in one pass whose
every error is one line naming the key, the value and what is allowed.

The schema is :mod:`hvdtrain.core.config_schema`; reading the text (YAML 1.2, TOML, ``--set``
strings) is :mod:`hvdtrain.core.config_files`.

Why the coercion and limits are written here rather than taken from pydantic v2 (measured on
2026-11-28 with pydantic 2.14.4, a ``TypeAdapter`` per field built from the same metadata:
``Annotated`` ``Ge``/``Gt``/``Le`` for ranges, ``Literal`` for choices, its errors translated back
into these lines): it was no shorter (62 lines against the 64 of :func:`_coerce`,
:func:`_is_flat` and :func:`_check_limits`, since every error still needs its own line here), and
7 of the 148 cases the config tests pin changed: ``train.epochs=true`` and ``optim.lr=true`` were
taken as 1 (pydantic's lax mode reads a bool as a number), ``checkpoint.resume=yes`` was refused
(a ``Literal`` of ``False, True, "auto"`` does not read ``yes`` as true), and a number given to a
string key (``log.run_name=1.10``, ``data.path=0755``, ``1e3``) lost the text it was written as.
Keeping them means one special case each around the library. Pydantic is also no dependency of
hvdtrain (it comes only with the MLflow and W&B extras), and importing it with a first adapter
took about three times as long as importing this whole package (1.4 to 1.6 s against 0.5 s, on a
loaded machine), paid on every rank at every start.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from pathlib import Path
from typing import Any, Callable

import yaml

from hvdtrain.core.config_error import ConfigError, key_text, short
from hvdtrain.core.config_files import parse_override, plain, read_file
from hvdtrain.core.config_schema import RunConfig, Schema, section_types


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)

def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert ``value`` to the annotated type ``tp`` or raise a ConfigError naming ``key``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [a for a in args if a is not type(None)]
        if type(None) in args and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
            return None
        for candidate in inner[:-1]:  # ``bool | str``: a truth value if it reads as one, else the text
            try:
                return _coerce(value, candidate, key)
            except ConfigError:
                continue
        return _coerce(value, inner[-1], key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "false", "no", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{key}: expected true or false, got {short(value)}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)) and not (
                isinstance(value, float) and value.is_integer()):
            raise ConfigError(f"{key}: expected an integer, got {short(value)}")
        try:
            return int(value)
        except ValueError:  # also a string of more digits than Python converts (sys.get_int_max_str_digits)
            raise ConfigError(f"{key}: expected an integer, got {short(value)}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {short(value)}")
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an integer beyond float's range
            raise ConfigError(f"{key}: expected a number, got {short(value)}") from None
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a string, got {short(value)}")
        return getattr(value, "text", None) or str(value)  # a number read from YAML: as it was written
    if tp is Any and not _is_flat(value):  # parallel.cut: a word or a list of numbers, never a deep tree
        raise ConfigError(f"{key}: expected a value or a list of values, got {short(value)}")
    return plain(value)


def _is_flat(value: Any) -> bool:
    """A scalar, or a list of scalars: what a free-form key may hold (a nested or aliased YAML tree,
    which can expand exponentially when copied, is refused)."""
    scalar = (str, int, float, bool, type(None))
    return isinstance(value, scalar) or isinstance(value, (list, tuple)) and all(isinstance(v, scalar) for v in value)


def _check_limits(value: Any, f: dataclasses.Field, key: str) -> None:
    meta = f.metadata
    if value is None:
        return
    if meta.get("choices") and value not in meta["choices"]:
        allowed = ", ".join(map(str, meta["choices"]))
        raise ConfigError(f"{key}: {short(value)} is not allowed; choose one of: {allowed}")
    lo, hi = meta.get("min"), meta.get("max")
    if isinstance(value, float) and not math.isfinite(value) and (lo is not None or hi is not None):
        raise ConfigError(f"{key}: {value!r} is not a finite number")
    if lo is not None and (value < lo or (meta.get("min_exclusive") and value == lo)):
        op = ">" if meta.get("min_exclusive") else ">="
        raise ConfigError(f"{key}: {value!r} is out of range; it must be {op} {lo}"
                          + (f" and <= {hi}" if hi is not None else ""))
    if hi is not None and value > hi:
        raise ConfigError(f"{key}: {value!r} is out of range; it must be <= {hi}"
                          + (f" and >= {lo}" if lo is not None else ""))


def from_dict(cls: type, data: dict[str, Any], prefix: str = "",
              sections: dict[str, type] | None = None,
              foreign_sections: dict[str, tuple[str, ...]] | None = None) -> Any:
    """Build dataclass ``cls`` from a nested dict, converting and validating every value.

    For :class:`RunConfig`, ``sections`` maps the recipe's own section names to their dataclasses;
    those top-level keys become ``config.sections`` (every section present, defaults filled in).
    ``foreign_sections`` (section -> recipes declaring it) names the owner of an unknown section.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {short(data)}")
    types = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    if cls is RunConfig:
        sections = dict(sections or {})
        names.pop("sections")
        clash = sorted(set(sections) & set(names))
        if clash:
            raise ConfigError(f"recipe section {clash[0]!r} has the name of a core config key; rename the section")
        types.update(sections)
    else:
        sections = {}
    unknown = [k for k in data if k not in names and k not in sections]
    if unknown:
        allowed = ", ".join([*names, *sections])
        raise ConfigError(f"unknown config key {key_text(prefix + str(unknown[0]))}"
                          f"{_owner_hint(unknown[0], foreign_sections) if cls is RunConfig else ''}; allowed keys"
                          f"{' in ' + prefix.rstrip('.') if prefix else ''}: {allowed}")
    kwargs: dict[str, Any] = {}
    recipe_sections = {name: tp() for name, tp in sections.items()}
    for name, value in data.items():
        tp, key = types[name], prefix + name
        if name in sections:
            recipe_sections[name] = from_dict(tp, value, key + ".")
        elif _is_dataclass_type(tp):
            kwargs[name] = from_dict(tp, value, key + ".")
        else:
            kwargs[name] = _coerce(value, tp, key)
    if cls is RunConfig:
        kwargs["sections"] = recipe_sections
    return cls(**kwargs)


def _owner_hint(section: str, foreign_sections: dict[str, tuple[str, ...]] | None) -> str:
    """`` (a section of recipe X)`` when another known recipe declares ``section``."""
    owners = (foreign_sections or {}).get(section, ())
    return f" (a section of recipe {', '.join(owners)}, not of this one)" if owners else ""


def validate(config: RunConfig) -> RunConfig:
    """Every section checks itself: re-checks every field's type, choices and range (core and
    recipe sections alike), then each section's own cross-field rules (a ``check()`` method that
    returns a problem or raises ConfigError). Rules that span sections or need the job live in
    :mod:`hvdtrain.core.rules`."""
    from_dict(RunConfig, to_dict(config), sections=section_types(config))  # types and unknown keys
    _walk_limits(config, "")
    core = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if dataclasses.is_dataclass(getattr(config, f.name))}
    for name, section in {**core, **config.sections}.items():
        check = getattr(section, "check", None)
        if callable(check):
            problem = check()
            if problem:
                raise ConfigError(f"{name}: {problem}")
    return config


def _walk_limits(obj: Any, prefix: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name == "sections" and isinstance(obj, RunConfig):
            for name, section in value.items():
                _walk_limits(section, prefix + name + ".")
        elif dataclasses.is_dataclass(value):
            _walk_limits(value, prefix + f.name + ".")
        else:
            _check_limits(value, f, prefix + f.name)


def to_dict(config: Any) -> dict[str, Any]:
    """The config as a plain nested dict (what is saved and broadcast); recipe sections appear as
    top-level sections next to the core's."""
    data = dataclasses.asdict(config)
    if isinstance(config, RunConfig):
        data.update(data.pop("sections"))
    return data


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key_text(dotted)}: {key_text(part)} is a value, not a section")
        node = child
    node[parts[-1]] = value


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base``."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_config(defaults: dict[str, Any] | None = None, file: str | Path | None = None,
                overrides: list[str] | tuple[str, ...] = (),
                schema: Schema | Callable[[str], Schema] | None = None, **top: Any) -> RunConfig:
    """Resolve a RunConfig: dataclass defaults < recipe ``defaults`` < ``file`` < ``top`` < ``overrides``.

    ``top`` takes dotted keys as keyword names with ``__`` for dots (``train__epochs=3``) and skips
    None values, which is what the CLI's optional flags pass. ``schema`` is the recipe's
    :class:`Schema`, or a function giving it for the recipe in force (the last ``recipe`` given,
    else the default): its own sections and the old spellings of keys it moved out of the core
    (``data.image_size`` -> ``image.size``), which still work. What the loader rewrote (an old
    spelling, ``train.fp16_allreduce``'s alias) is in ``config.notes``, one line each, which rank 0
    prints as the run begins (:class:`hvdtrain.core.visibility.ConfigNotes`): the loader prints
    nothing, as it runs on every rank before Horovod knows which one is rank 0.
    :func:`hvdtrain.core.resolve.load_config` passes the registry's recipes and asks the rulebook.
    """
    file_data = read_file(file) if file else {}
    pairs = [(key.replace("__", "."), value) for key, value in top.items() if value is not None]
    pairs += [parse_override(text) for text in overrides]
    recipe = next((v for k, v in reversed(pairs) if k == "recipe"),
                  file_data.get("recipe", (defaults or {}).get("recipe", RunConfig.recipe)))
    recipe = str(recipe)
    if callable(schema):
        schema = schema(recipe)
    schema = schema or Schema()
    data: dict[str, Any] = {}
    notes: list[str] = []
    for layer in (defaults or {}, file_data):
        data = merge(data, _apply_moves(layer, schema, recipe, notes))
    for key, value in pairs:
        layer: dict[str, Any] = {}
        _set_path(layer, key, value)
        relocated = _apply_moves(layer, schema, recipe, notes)
        if relocated != layer:  # an old spelling: set at its new place
            data = merge(data, relocated)
        else:
            _set_path(data, key, value)
    config = from_dict(RunConfig, data, sections=dict(schema.sections), foreign_sections=schema.foreign_sections)
    if config.train.fp16_allreduce and config.comm.compression == "none":  # one key for fp16: the alias
        config.comm.compression = "fp16"
        notes.append("train.fp16_allreduce=true is the older spelling of comm.compression=fp16; the old key "
                     "still works")
    config = validate(config)
    config.notes = tuple(dict.fromkeys(notes))  # an instance attribute, carried where the config is pickled
    return config


def _pop_path(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    parts, node = dotted.split("."), data
    for part in parts[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return False, None
    if parts[-1] not in node:
        return False, None
    return True, node.pop(parts[-1])


def _apply_moves(layer: dict[str, Any], schema: Schema, recipe: str, notes: list[str]) -> dict[str, Any]:
    """``layer`` with every old key spelling the recipe moved rewritten to its new place (a line
    for each in ``notes``); an old key that another recipe moved is an error naming where it belongs."""
    layer = copy.deepcopy(layer)
    for old, new in schema.moved_keys.items():
        found, value = _pop_path(layer, old)
        if found:
            _set_path(layer, new, value)
            notes.append(f"{old} is now {new} (a key of recipe {recipe}); the old spelling still works")
    for old, (new, owner) in schema.foreign_moves.items():
        found, _ = _pop_path(copy.deepcopy(layer), old)
        if found:
            raise ConfigError(f"unknown config key {old}: it moved to {new}, a key of recipe {owner}; "
                              f"recipe {recipe} has no such key")
    return layer


def dump_yaml(config: RunConfig | dict[str, Any]) -> str:
    """The resolved config (or its plain-dict form, such as the config as it ran) as YAML text (the
    real values: a writer passes the dict through :func:`hvdtrain.core.redact.redact_values` first,
    as ``config.yaml``'s does)."""
    return yaml.safe_dump(config if isinstance(config, dict) else to_dict(config), sort_keys=False)
