"""Each domain's metrics of an evaluation (from the summed and per-record statistics of a split),
here below both the training loop and `triskele.eval` so that training can report them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from triskele.train.metrics import deepfake, mars, merch

MetricsFn = Callable[[dict[str, np.ndarray]], dict[str, Any]]
DOMAIN_METRICS: dict[str, MetricsFn] = {"mars": mars.metrics, "deepfake": deepfake.metrics, "merch": merch.metrics}
METRIC_NAMES: dict[str, tuple[str, ...]] = {"mars": mars.NAMES, "deepfake": deepfake.NAMES, "merch": merch.NAMES}
ALWAYS = ("eval_loss",)


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """{'iou': {'sand': 0.5}} -> {'iou/sand': 0.5}; the numbers only."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        elif isinstance(value, int | float | np.number) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


def check_best_metric(domain: str, name: str) -> None:
    known = (*ALWAYS, *METRIC_NAMES.get(domain, ()))
    if name not in known:
        raise ValueError(f"checkpoint.best_metric={name!r} is not a {domain} metric; choose one of {', '.join(known)}")
