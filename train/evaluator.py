"""One evaluator shape for every domain (big_vision's evaluators are the habit followed): an
evaluator accumulates a split's totals from the model's outputs, turns totals into metrics, says
how they were made, and writes its artifacts. The same object serves evaluation during training,
`triskele.eval.evaluate_checkpoint` and its report; a domain's spec says how to build it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np
from triskele.mesh import host_to_global, process_rows
from triskele.train.bookkeeping.stop import StopRequest
from triskele.train.data.pipeline import Source, eval_batches, eval_rows

Totals = dict[str, np.ndarray]
MetricsFn = Callable[[dict[str, np.ndarray]], dict[str, Any]]
"""A domain's metrics of a split, from its summed and per-record statistics."""


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """{'iou': {'sand': 0.5}} -> {'iou/sand': 0.5}; the numbers only."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        elif isinstance(value, int | float | np.number) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


@runtime_checkable
class Evaluator(Protocol):
    def accumulate(self, params: Any, source: Source, stop: StopRequest | None = None) -> Totals:
        """Every record of `source` once: the sums and per-record values the metrics read, with
        `loss_sum` and `weight` (eval_loss) and `unreadable` (records left out, unreadable).
        `stop`: checked after each batch (`StopRequest.raise_if_requested`)."""
        ...

    def metrics(self, totals: Totals) -> dict[str, Any]:
        """The domain's metrics of the totals (nested dicts allowed: {'iou': {'sand': 0.5}})."""
        ...

    def report(self, totals: Totals) -> dict[str, Any]:
        """What the report says besides the metrics: how they were made ({} when nothing)."""
        ...

    def write_artifacts(self, params: Any, source: Source, totals: Totals, out_dir: Path) -> list[str]:
        """Plots and pictures of the evaluation in `out_dir`; their file names."""
        ...


EvaluatorFactory = Callable[[Any, bool], Evaluator]
"""(run parts, for_report) -> the domain's evaluator for that run; `for_report` is True for
`evaluate_checkpoint`, whose report may ask for more than training's evaluations do."""


def scalar_metrics(evaluator: Evaluator, totals: Totals) -> dict[str, float]:
    """eval_loss and the evaluator's metrics flattened ('iou/sand'): what training logs and selects on."""
    eval_loss = float(totals["loss_sum"] / max(float(totals["weight"]), 1.0))
    return {"eval_loss": eval_loss, **flatten(evaluator.metrics(totals))}


class BatchEvaluator:
    """The model's `eval_stats` over the split's fixed-size records in batches of the run's global
    batch (padding masked out), read ahead as training reads (`data.threads`, `data.prefetch`,
    `data.workers`): sums added up, per-record values concatenated in record order; the domain's
    `metrics_fn` reads them."""

    def __init__(self, parts: Any, metrics_fn: MetricsFn):
        self.parts, self.metrics_fn = parts, metrics_fn

    @classmethod
    def factory(cls, metrics_fn: MetricsFn) -> EvaluatorFactory:
        """The spec's `evaluator` for a domain whose evaluation is this one with its metrics."""
        return lambda parts, for_report=False: cls(parts, metrics_fn)

    def accumulate(self, params: Any, source: Source, stop: StopRequest | None = None) -> Totals:
        parts = self.parts
        data = parts.config.data
        batch_size = data.global_batch
        rows = process_rows(parts.mesh, batch_size)
        totals: dict[str, np.ndarray] = {}
        records: dict[str, list[np.ndarray]] = {}
        unreadable = 0
        batches = eval_batches(source, batch_size, rows, data.threads, data.prefetch, data.workers)
        with jax.set_mesh(parts.mesh):
            for b, local in enumerate(batches):
                if stop is not None:
                    stop.raise_if_requested()
                real = int((eval_rows(b, batch_size, rows) < len(source)).sum())
                unreadable += real - int(local["valid"].sum())  # counted here: worker processes keep their own notes
                sums, per_record = jax.device_get(parts.eval_step(params, host_to_global(local, parts.mesh,
                                                                                          batch_size)))
                for key, value in sums.items():
                    totals[key] = totals.get(key, 0) + np.asarray(value, np.float64)
                keep = np.asarray(per_record.pop("valid")) > 0
                for key, value in per_record.items():
                    records.setdefault(key, []).append(np.asarray(value)[keep])
        left_out = {"unreadable": unreadable} if hasattr(source, "bad") else {}
        names = getattr(source, "family_names", None)
        families = {"family_names": np.array(names)} if names is not None else {}
        return {**totals, **left_out, **families, **{key: np.concatenate(value) for key, value in records.items()}}

    def metrics(self, totals: Totals) -> dict[str, Any]:
        return self.metrics_fn(totals)

    def report(self, totals: Totals) -> dict[str, Any]:
        return {}

    def write_artifacts(self, params: Any, source: Source, totals: Totals, out_dir: Path) -> list[str]:
        return []
