"""Configs saved by older runs (config.json, or the copy inside a checkpoint), read as today's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from triskele.train.config.checks import check_config
from triskele.train.config.overrides import apply_key, domain_options, moved_to, set_domain
from triskele.train.config.schema import Config
from triskele.train.domains import domains


def _migrate(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config saved before the domain options left `data`: its `data.<option>` keys under the
    domain's name (other domains' options, saved at their defaults, are dropped)."""
    data = dict(data)
    section = dict(data.get("data") or {})
    domain = data.get("domain", Config.domain)
    for field in list(section):
        moved = moved_to(f"data.{field}")
        if moved is None:
            continue
        value = section.pop(field)
        owner, _, name = moved.partition(".")
        if owner == domain or field in {f.name for f in dataclasses.fields(domain_options(domain))}:
            data.setdefault(domain, {})
            data[domain] = {**data[domain], name: value}
    if "data" in data:
        data["data"] = section
    return data


def _with_legacy_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A saved config's domain options that it lacks, as the domain's `legacy_defaults` give them
    (its options resolved when a run starts: a saved config saved them, unless saved before them)."""
    name = data.get("domain", Config.domain)
    domain = domains().get(name) if isinstance(name, str) else None
    saved = data.get(name, {})
    if domain is not None and domain.legacy_defaults and isinstance(saved, Mapping):
        data[name] = {**domain.legacy_defaults, **saved}
    return data


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Rebuilds a saved config (config.json, or the copy inside a checkpoint), from before the domain
    options moved out of `data` too."""
    data = _with_legacy_defaults(_migrate(data))
    config = Config()
    set_domain(config, data.get("domain", config.domain))
    for key, value in data.items():
        apply_key(config, str(key), value)
    check_config(config)
    return config
