"""Merch's evaluator: the model's per-record outputs over the split (`metrics`) and two pictures:
recognition at k (closed-set top-k accuracy beside open-set retrieval recall@k), and the shelf
facings judged against the truth (violations flagged / missed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from triskele.train.bookkeeping.plots import save_figure
from triskele.train.bookkeeping.stop import StopRequest
from triskele.train.data.pipeline import Source
from triskele.train.domains.merch import compliance_metrics, detection_metrics, recognition_metrics
from triskele.train.domains.merch.metrics import NAMES, at_k, facings, metrics, violations
from triskele.train.evaluator import BatchEvaluator

K = 5
"""Ranks the recognition picture shows: the 5 a closed-set record keeps."""
CURVES = {"top-k": "known SKUs: top-k accuracy", "recall@k": "new SKUs: retrieval recall@k"}


def recognition_figure(curves: dict[str, np.ndarray]):
    """Bars per k of each curve of `at_k`, on [0, 1], the legend right of the axes. A matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.5))
    width = 0.8 / len(curves)
    for i, (name, values) in enumerate(curves.items()):
        ks = np.arange(1, len(values) + 1)
        bars = ax.bar(ks + (i - (len(curves) - 1) / 2) * width, values, width=width, label=CURVES[name])
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(np.arange(1, K + 1))
    ax.set_xlabel("k")
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("crops with their SKU in the first k")
    ax.set_title("SKU recognition at k", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def violation_table(predicted: np.ndarray, expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Facings counted by (truly a violation, flagged as one): rows and columns no, yes."""
    flagged, violation = violations(predicted, expected, actual)
    table = np.zeros((2, 2), np.int64)
    np.add.at(table, (violation.astype(int), flagged.astype(int)), 1)
    return table


def planogram_figure(table: np.ndarray):
    """The facings' violation table as a 2 x 2 grid of counts. A matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    ax.imshow(table / max(table.sum(), 1), cmap="Blues", vmin=0, vmax=1)
    names = ["compliant", "violation"]
    ax.set_xticks([0, 1], names)
    ax.set_yticks([0, 1], names)
    ax.set_xlabel("judged (the model against the plan)")
    ax.set_ylabel("truth")
    for i in range(2):
        for j in range(2):
            ax.text(j, i, str(table[i, j]), ha="center", va="center")
    ax.set_title(f"planogram: {table.sum()} shelf facings", fontsize=10)
    fig.tight_layout()
    return fig


class MerchEvaluator(BatchEvaluator):
    def __init__(self, parts: Any, for_report: bool = False):
        super().__init__(parts, metrics)

    def write_artifacts(self, params: Any, source: Source, totals: dict[str, Any], out_dir: Path) -> list[str]:
        """recognition.png where the split has closed- or open-set records, planogram.png where it has shelves."""
        written = []
        curves = at_k(totals, K)
        if curves:
            save_figure(recognition_figure(curves), out_dir / "recognition.png")
            written.append("recognition.png")
        shelf = facings(totals)
        if shelf is not None:
            table = violation_table(shelf["predicted"], shelf["expected"], shelf["actual"])
            save_figure(planogram_figure(table), out_dir / "planogram.png")
            written.append("planogram.png")
        return written


class ShelfEvaluator(BatchEvaluator):
    """The facing detector over shelf photos: COCO's AP, AP50, AP75, AR@300, the score threshold of
    the best detection F1, and that F1 and the count error at `merch.score_threshold` (unset: the
    threshold chosen), from each photo's decoded detections and its true boxes; with
    recognition, the SKUs of the facings it found (`recognition_metrics`)."""

    def __init__(self, parts: Any, for_report: bool = False):
        super().__init__(parts, self._metrics)

    def _metrics(self, totals: dict[str, Any]) -> dict[str, float]:
        truth = [boxes[valid > 0] for boxes, valid in zip(totals["true_boxes"], totals["box_valid"], strict=True)]
        boxes, scores = list(totals["boxes"]), list(totals["scores"])
        given = self.parts.config.options.score_threshold  # unset (training's val): its own choice
        scored = {**detection_metrics.coco_scores(truth, boxes, scores),
                  **detection_metrics.threshold_scores(truth, boxes, scores, given)}
        threshold = scored["score_threshold"] if given is None else given
        if "true_skus" not in totals:
            return scored
        true_skus = [skus[valid > 0] for skus, valid in zip(totals["true_skus"], totals["box_valid"], strict=True)]
        scored.update(recognition_metrics.recognition_scores(truth, true_skus, boxes, scores, totals["sku"],
                                                             totals["sku_cosine"], threshold))
        if "planograms" in totals:
            unknown = self.parts.config.options.unknown_threshold  # unset (training's val): its own choice
            unknown = scored["unknown_threshold"] if unknown is None else unknown
            width = self.parts.config.model.image_size  # each record is a photo (or tile) of the input's size
            scored.update(compliance_metrics.compliance_scores(totals, threshold, unknown, width))
        return scored

    def accumulate(self, params: Any, source: Source, stop: StopRequest | None = None) -> dict[str, Any]:
        """The batches' totals and, for synthetic photos, each photo's planogram (`planograms`, JSON)."""
        totals = super().accumulate(params, source, stop)
        if hasattr(source, "photo"):
            totals["planograms"] = np.array([json.dumps(source.photo(i).planogram) for i in range(len(source))])
        return totals


METRIC_NAMES = NAMES + detection_metrics.NAMES + recognition_metrics.NAMES + compliance_metrics.NAMES
"""What `checkpoint.best_metric` may name in a merch run: the recogniser's and the detector's."""
