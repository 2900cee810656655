"""A config made for a run: a preset, then files, then `--set KEY=VALUE` overrides (later wins)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from triskele.train.config.checks import check_choice, check_config
from triskele.train.config.keys import UnknownKey, load_file, parse_override, set_key, set_section
from triskele.train.config.presets import DEFAULT_PRESET, PRESETS
from triskele.train.config.schema import Config
from triskele.train.domains import domains, get_domain


def domain_options(domain: str) -> Any:
    """The options of `domain` at their defaults (an instance of its spec's options dataclass)."""
    return get_domain(domain).options()


def moved_to(key: str) -> str | None:
    """`data.holdout` -> `deepfake.holdout`: where a key that moved into a domain's options lives now."""
    section, _, field = key.partition(".")
    if section != "data":
        return None
    for name, domain in domains().items():
        if field in {f.name for f in dataclasses.fields(domain.options)}:
            return f"{name}.{field}"
    return None


def set_domain(config: Config, name: Any) -> None:
    """Makes `config` a config of the domain `name`, its options at their defaults unless they already are its."""
    set_key(config, "domain", name)
    check_choice("domain", config.domain, list(domains()))
    if not isinstance(config.options, get_domain(config.domain).options):
        config.options = domain_options(config.domain)


def _apply_domain_option(config: Config, key: str, value: Any) -> bool:
    """Applies `<domain>.<option>`; False when `key` names no registered domain."""
    head, _, rest = key.partition(".")
    if head not in domains():
        return False
    if head != config.domain:
        raise ValueError(f"config key {key!r} is an option of the {head} domain, but this run's domain is "
                         f"{config.domain}; use a {head} preset or set {config.domain}.<option>")
    if rest:
        set_key(config.options, rest, value, head + ".")
    else:
        set_section(config.options, head, value)
    return True


def apply_key(config: Config, key: str, value: Any) -> None:
    """Sets one dotted key of a run's config: a shared key, `domain`, or `<domain>.<option>`."""
    if key == "domain":
        set_domain(config, value)
        return
    if _apply_domain_option(config, key, value):
        return
    head = key.partition(".")[0]
    settable = [field.name for field in dataclasses.fields(Config) if field.name != "options"]
    if head not in settable:
        raise ValueError(f"unknown config key {head!r}; known keys here: {', '.join(settable)}")
    try:
        set_key(config, key, value)
    except UnknownKey:
        moved = moved_to(key)
        if moved:
            raise ValueError(f"config key {key!r} moved to {moved!r}; set {moved}=...") from None
        raise


def make_config(
    preset: str = DEFAULT_PRESET,
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    files: Iterable[str | Path] = (),
) -> Config:
    """A preset, then each file, then each override (later wins). Overrides: dict or KEY=VALUE strings."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets are {', '.join(PRESETS)}")
    config = Config(preset=preset)
    for key, value in PRESETS[preset].items():
        apply_key(config, key, value)
    for path in files:
        for key, value in load_file(path).items():
            apply_key(config, str(key), value)
    if overrides is None:
        overrides = {}
    items = overrides.items() if isinstance(overrides, Mapping) else map(parse_override, overrides)
    for key, value in items:
        apply_key(config, key, value)
    check_config(config)
    return config
