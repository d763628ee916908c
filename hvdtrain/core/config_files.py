"""Config text read into plain values: YAML, JSON and TOML files and ``--set key=value`` strings.

YAML is read with YAML 1.2's core schema (:class:`ConfigLoader`), duplicate keys refused, nesting
bounded; every failure is a :class:`~hvdtrain.core.config.ConfigError` of one line naming the file
and where. What the values mean is the schema's business (:mod:`hvdtrain.core.config_schema`),
checked by :mod:`hvdtrain.core.config_loader`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hvdtrain.core.config_error import ConfigError, one_line, short


class _Int(int):
    """An integer read from YAML, with the text it was written as (``0755``, ``010``): a string key
    given it keeps that text, not the number's spelling."""

    text: str


class _Float(float):
    """A float read from YAML, with the text it was written as (``1.10``)."""

    text: str


def plain(value: Any) -> Any:
    """``value`` with :class:`_Int`/:class:`_Float` (anywhere in a list) made plain numbers."""
    if isinstance(value, _Int):
        return int(value)
    if isinstance(value, _Float):
        return float(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's core schema and no duplicate keys, for config files
    (YAML and JSON) and ``--set`` values alike.

    YAML 1.1 (PyYAML's default) reads ``010`` as 8, ``0123`` as 83, ``1:30`` as 90, ``yes``/``on``
    as true and ``2020-01-01`` as a date; YAML 1.2 reads decimal digits as decimal, ``0o``/``0x``
    as octal/hex, only ``true``/``false`` as truth values and no sexagesimal numbers or dates.
    Numbers keep the text they were written as (a string key given ``1.10`` gets ``"1.10"``).
    A key given twice in one mapping (a section written twice, whose first block YAML 1.1 silently
    dropped) is an error naming the key and both lines, as TOML does."""

    yaml_implicit_resolvers: dict = {}

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # unhashable: PyYAML's own error follows
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {short(key)} (first given at line {first.line + 1}); give "
                        f"each key once", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.Node) -> int:
        text = str(self.construct_scalar(node))
        body = text.lstrip("+-")
        base = {"0o": 8, "0x": 16}.get(body[:2].lower(), 10)
        number = _Int((-1 if text.startswith("-") else 1) * int(body[2:] if base != 10 else body, base))
        number.text = text
        return number

    def construct_yaml_float(self, node: yaml.Node) -> float:
        text = str(self.construct_scalar(node))
        lowered = text.lower()
        if lowered.lstrip("+-") in (".inf", ".nan"):
            number = _Float(("-" if lowered.startswith("-") else "") + lowered.lstrip("+-")[1:])
        else:
            number = _Float(text)
        number.text = text
        return number


for _first, _resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items():  # keep null, merge, value
    ConfigLoader.yaml_implicit_resolvers[_first] = [
        (tag, regexp) for tag, regexp in _resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                       "tag:yaml.org,2002:timestamp")]
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                   list("-+0123456789"))
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"))
ConfigLoader.add_constructor("tag:yaml.org,2002:int", ConfigLoader.construct_yaml_int)
ConfigLoader.add_constructor("tag:yaml.org,2002:float", ConfigLoader.construct_yaml_float)
ConfigLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_scalar)  # !!timestamp: text


def read_yaml(text: str) -> Any:
    """``text`` read with :class:`ConfigLoader` (YAML 1.2 core schema, no duplicate keys)."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506  (a SafeLoader subclass)


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``section.key=value``; the value is read as YAML (so 3, 0.1, true and null are typed)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    if not raw.strip() or _nesting(raw) > MAX_NESTING:
        return key, raw if raw.strip() else ""
    try:
        value = read_yaml(raw)
    except (yaml.YAMLError, ValueError, RecursionError):  # not YAML (or a bad !!tag): the text itself
        value = raw
    return key, value


MAX_NESTING = 64  # brackets deep; PyYAML recurses per level (and takes seconds to fail at Python's limit)


def _nesting(text: str) -> int:
    """How deep ``[``/``{`` brackets nest in ``text`` (those inside quotes counted too: an upper bound)."""
    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", text):
        depth = depth + 1 if bracket in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def read_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) config file into a dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(f"config file {path}: unknown extension {path.suffix!r}; use .yaml, .yml, .json or .toml")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    if path.suffix == ".toml":
        import tomllib
        try:
            data = tomllib.loads(text)
        except ValueError as exc:  # TOMLDecodeError, or an integer of more digits than Python converts
            raise ConfigError(f"config file {path}: {one_line(str(exc))}") from None
        except RecursionError:
            raise ConfigError(f"config file {path}: nested too deeply") from None
    else:
        if _nesting(text) > MAX_NESTING:
            raise ConfigError(f"config file {path}: brackets nested more than {MAX_NESTING} deep")
        try:
            data = read_yaml(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: {_yaml_problem(exc)}") from None
        except ValueError as exc:  # a value the YAML tag cannot hold (!!int abc, month 13, too many digits)
            raise ConfigError(f"config file {path}: {one_line(str(exc))}") from None
        except RecursionError:
            raise ConfigError(f"config file {path}: nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parser error on one line: where (line, column) and what (PyYAML's own message spans
    several lines with a snippet of the file)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return one_line(str(exc))
    context = getattr(exc, "context", None)
    return one_line(f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
                     + (f" ({context})" if context else ""))



