"""Setting one dotted key of a config section from text, YAML or JSON: typed, checked, named in every error.

Knows dataclasses and their annotations only; what a key of `Config` itself means (a domain's
options, a key that moved) is `triskele.train.config.overrides`'.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from triskele.train.config.yaml_format import YamlLoader

LEGACY_VALUES: dict[str, dict[Any, Any]] = {"model.remat": {True: "full", False: "none"}}
"""Values older configs (and checkpoints) spell differently: model.remat was a bool."""


def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def coerce(key: str, value: Any, annotation: Any) -> Any:
    """Checks `value` against the field's type, converting the few safe cases (int -> float)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (annotation,) = [a for a in args if a is not type(None)]
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads '3e-4' (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif typing.get_origin(annotation) is list:
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return list(value)
    elif annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    expected = getattr(annotation, "__name__", str(annotation))
    raise ValueError(f"config key {key!r} must be {expected}, got {value!r} ({type(value).__name__})")


class UnknownKey(ValueError):
    """A key that names no field of its section."""


def set_section(section: Any, full: str, value: Any) -> None:
    """Sets each key of the mapping `value` in the dataclass `section` (spelled `full` in errors)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"config key {full!r} is a section; set its fields, e.g. {full}.<field>=...")
    for sub_key, sub_value in value.items():
        set_key(section, str(sub_key), sub_value, full + ".")


def set_key(section: Any, key: str, value: Any, prefix: str = "") -> None:
    """Sets the dotted `key` of the dataclass `section` (nested sections followed), coercing the
    value to the field's type; `prefix` is how the section is spelled in errors."""
    head, _, rest = key.partition(".")
    types_ = field_types(type(section))
    full = prefix + head
    if head not in types_:
        known = ", ".join(prefix + name for name in types_)
        raise UnknownKey(f"unknown config key {full!r}; known keys here: {known}")
    current = getattr(section, head)
    if dataclasses.is_dataclass(current):
        if rest:
            set_key(current, rest, value, full + ".")
        else:
            set_section(current, full, value)
        return
    if rest:
        raise ValueError(f"config key {full!r} is a value, not a section: {full}.{rest} does not exist; "
                         f"set {full}=VALUE")
    value = LEGACY_VALUES.get(full, {}).get(value, value) if isinstance(value, bool) else value
    setattr(section, head, coerce(full, value, types_[head]))


def parse_override(text: str) -> tuple[str, Any]:
    """`optim.lr=3e-4` -> ("optim.lr", 0.0003); values are read as YAML scalars."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} is not KEY=VALUE; write e.g. optim.lr=3e-4")
    try:
        value = yaml.load(raw, Loader=YamlLoader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw.strip()  # not a YAML scalar: the text itself (a string field may take it)
    return key.strip(), value


def load_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist; --config takes a YAML or JSON file of "
                         "overrides (nested or dotted keys)")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=YamlLoader)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"config file {str(path)!r} is not valid {path.suffix[1:] or 'YAML'}: {err}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"config file {str(path)!r} holds a {type(data).__name__}, not a mapping of keys to values; "
                         "write e.g. `optim: {lr: 0.0003}` or `optim.lr: 0.0003`")
    return dict(data)

