"""The domains triskele trains, evaluates and serves: one `Domain` spec each, registered once.

A spec is everything the engine, the config, evaluation and prediction need to know about a
domain; nothing else names a domain. Adding one is its own modules plus one `register(Domain(...))`
(docs/development.md, "Adding a domain"). The built-in domains register on first lookup: each
module in `BUILTIN` defines its spec as `SPEC` (`triskele.train.domains.spec`), which imports no
registry, so registering one is not an import circle.

Registering imports no JAX: what a command line parses (names, presets, flags, commands) is plain
data, and a spec value that needs the model's libraries (its evaluator, its metric names) may be
`Later(module, name)`, loaded when it is first read.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any

from triskele.train.domains.spec import Domain, Later, task_spec

if TYPE_CHECKING:
    from triskele.train.config.schema import Config

__all__ = ["BUILTIN", "Domain", "Later", "class_names", "domains", "get_domain", "register", "resolve_from_data",
           "spec_for", "spec_of", "task_spec", "unregister"]

BUILTIN = ("mars", "merch", "deepfake")
"""Modules of `triskele.train.domains` that register a built-in domain."""


_REGISTRY: dict[str, Domain] = {}


def register(domain: Domain) -> Domain:
    """Makes `domain` known to presets, configs, training, evaluation and prediction."""
    if not dataclasses.is_dataclass(domain.options):
        raise TypeError(f"domain {domain.name!r}: options must be a dataclass type, got {domain.options!r}")
    _REGISTRY[domain.name] = domain
    return domain


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def domains() -> dict[str, Domain]:
    """Every registered domain by name, the built-in ones first."""
    for module in BUILTIN:
        if module not in _REGISTRY:
            register(importlib.import_module(f"{__name__}.{module}").SPEC)
    return {**{name: _REGISTRY[name] for name in BUILTIN}, **_REGISTRY}


def get_domain(name: str) -> Domain:
    known = domains()
    if name not in known:
        raise ValueError(f"unknown domain {name!r}; domains: {', '.join(known)}")
    return known[name]


def spec_of(name: str, options: Any) -> Domain:
    """The spec a model of the domain `name` runs with: the domain's, for the task its options (a
    dataclass, or a saved mapping) name."""
    return task_spec(get_domain(name), options)


def spec_for(config: Config) -> Domain:
    """The spec a run of `config` runs with."""
    return spec_of(config.domain, config.options)


def class_names(config: Config) -> list[str]:
    """The run's class names: saved in its config, or (a run that started before they were saved)
    read from its data as at training time, with an error that says so if the data is not there."""
    if config.model.class_names is not None:
        return list(config.model.class_names)
    try:
        return spec_for(config).class_names(config)
    except ValueError as err:
        raise ValueError(f"this run's config has no model.class_names (it was saved before they were recorded), and "
                         f"reading them from its training data failed: {err}. Point --data at the data it was "
                         "trained on, or set model.class_names") from None


def resolve_from_data(config: Config) -> Domain:
    """Fills what a run takes from its data when it starts, saved with it so that inference never
    reads the training data: the domain's data-dependent options and the model's class names."""
    domain = spec_for(config)
    if domain.resolve is not None:
        domain.resolve(config)
    config.model.class_names = class_names(config)
    return domain
