"""YAML as configs read and write it: YAML 1.2's plain scalars, quoted where another reader would differ."""

from __future__ import annotations

import re

import yaml


class YamlLoader(yaml.SafeLoader):
    """YAML's safe loader with YAML 1.2's plain scalars: YAML 1.1 reads `20:25` as the integer 1225
    and `off`, `no`, `on`, `yes` as booleans, which would turn `run.profile_steps=20:25` and
    `run.compilation_cache=off` into nonsense."""


_YAML_1_2_SCALARS = {
    "tag:yaml.org,2002:bool": r"^(?:true|True|TRUE|false|False|FALSE)$",
    "tag:yaml.org,2002:int": r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$",
    "tag:yaml.org,2002:float": r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
                               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
}
YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML_1_2_SCALARS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _pattern in _YAML_1_2_SCALARS.items():
    YamlLoader.add_implicit_resolver(_tag, re.compile(_pattern), list("-+0123456789.tTfF"))


class YamlDumper(yaml.SafeDumper):
    """Writes YAML that YamlLoader and plain YAML 1.1 loaders both read back as written: a string
    either would resolve to another type is quoted (`'20:25'`, `'off'`, `'null'`, `'2024-01-01'`)."""


YamlDumper.yaml_implicit_resolvers = {
    first: [*yaml.SafeDumper.yaml_implicit_resolvers.get(first, []), *YamlLoader.yaml_implicit_resolvers.get(first, [])]
    for first in {*yaml.SafeDumper.yaml_implicit_resolvers, *YamlLoader.yaml_implicit_resolvers}
}
# Other readers: YAML 1.2's core schema reads `1e-3` as a float and `0o17` as an int, YAML 1.1's spec `y` as a bool.
YamlDumper.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
                                 list("-+0123456789."))
YamlDumper.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^0o[0-7]+$"), ["0"])
YamlDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
YamlDumper.add_representer(  # a list (class names) on one line
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True))
