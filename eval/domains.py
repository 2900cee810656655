"""Each domain's evaluation module: write_artifacts(...), class_names(config), predict_folder(...)."""

from __future__ import annotations

from types import ModuleType

from triskele.eval import deepfake, mars, merch

DOMAINS: dict[str, ModuleType] = {"mars": mars, "deepfake": deepfake, "merch": merch}


def get_domain(domain: str) -> ModuleType:
    if domain not in DOMAINS:
        raise ValueError(f"domain {domain!r} has no evaluation yet; domains: {', '.join(DOMAINS)}")
    return DOMAINS[domain]


def metrics_fn(domain: str):
    """The summed-statistics -> metrics function (what `train` uses by default)."""
    from triskele.train.metrics import DOMAIN_METRICS

    get_domain(domain)
    return DOMAIN_METRICS[domain]
