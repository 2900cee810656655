"""Mars terrain metrics from the confusion matrix accumulated over a whole split (label 255
ignored): pixel accuracy, per-class IoU, mIoU and per-class recall (sand recall is the safety number)."""

from __future__ import annotations

from typing import Any

import numpy as np
from triskele.models.mars import CLASS_NAMES

NAMES = ("miou", "pixel_acc", *(f"iou/{c}" for c in CLASS_NAMES), *(f"recall/{c}" for c in CLASS_NAMES))
"""The scalar metrics (nested ones flattened with '/'), e.g. for checkpoint.best_metric."""


def confusion_metrics(confusion: np.ndarray) -> dict[str, Any]:
    """Rows are the truth, columns the prediction. A class absent from both has no IoU (NaN is left
    out of the mean), as in the usual mIoU."""
    confusion = np.asarray(confusion, np.float64)
    true_positive = np.diag(confusion)
    truth = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    union = truth + predicted - true_positive
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, true_positive / union, np.nan)
        recall = np.where(truth > 0, true_positive / truth, np.nan)
    total = confusion.sum()
    return {
        "pixel_acc": float(true_positive.sum() / total) if total else float("nan"),
        "miou": float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan"),
        "iou": {name: float(v) for name, v in zip(CLASS_NAMES, iou, strict=True)},
        "recall": {name: float(v) for name, v in zip(CLASS_NAMES, recall, strict=True)},
    }
