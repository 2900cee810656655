"""Each domain's metrics of an evaluation (from the summed and per-record statistics of a split),
here below both the training loop and `triskele.eval` so that training can report them. A domain's
spec (`triskele.train.domains`) names its metrics function and metric names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

MetricsFn = Callable[[dict[str, np.ndarray]], dict[str, Any]]
ALWAYS = ("eval_loss",)
"""Metrics every evaluation reports, whatever the domain."""


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """{'iou': {'sand': 0.5}} -> {'iou/sand': 0.5}; the numbers only."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        elif isinstance(value, int | float | np.number) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out
