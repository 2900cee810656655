"""Deepfake metrics as DeepfakeBench computes them (`training/metrics/utils.py`): frame AUC, EER
(FPR where |FNR - FPR| is smallest on the ROC), AP, accuracy at 0.5, and video AUC (frame
probabilities averaged per video, then AUC); a video model's records are whole clips.

The cross-manipulation table: `auc_frame/<family>` and `auc_video/<family>` score each family's
fakes against every real of the split, where records carry their family (`family`, a code into
`family_names`, 0 = real)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn import metrics as skm

NAMES = ("auc_frame", "auc_video", "eer", "ap", "acc")


def roc_metrics(labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    labels, scores = np.asarray(labels).astype(int), np.asarray(scores, np.float64)
    if len(np.unique(labels)) < 2:
        raise ValueError(f"AUC needs real and fake records; the split has only label {int(labels[0])}")
    fpr, tpr, _ = skm.roc_curve(labels, scores, pos_label=1)
    fnr = 1 - tpr
    return {
        "auc": float(skm.auc(fpr, tpr)),
        "eer": float(fpr[np.nanargmin(np.abs(fnr - fpr))]),
        "ap": float(skm.average_precision_score(labels, scores)),
        "acc": float(((scores > 0.5).astype(int) == np.clip(labels, 0, 1)).mean()),
    }


def video_scores(videos: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per video: mean fake probability of its records, and its label."""
    ids, inverse = np.unique(np.asarray(videos), return_inverse=True)
    mean = np.bincount(inverse, weights=np.asarray(scores, np.float64)) / np.bincount(inverse)
    video_labels = np.zeros(len(ids), int)
    video_labels[inverse] = np.asarray(labels).astype(int)
    return video_labels, mean


def family_aucs(totals: dict[str, np.ndarray]) -> dict[str, float]:
    """Per manipulation family present: frame and video AUC of its fakes against all reals."""
    if "family" not in totals or "family_names" not in totals:
        return {}
    family, names = np.asarray(totals["family"]), [str(n) for n in totals["family_names"]]
    result = {}
    for code in sorted(set(np.unique(family).tolist()) - {0}):
        chosen = (family == 0) | (family == code)
        labels, scores = totals["label"][chosen], totals["score"][chosen]
        video_labels, video_mean = video_scores(totals["video"][chosen], labels, scores)
        result[f"auc_frame/{names[code]}"] = roc_metrics(labels, scores)["auc"]
        result[f"auc_video/{names[code]}"] = roc_metrics(video_labels, video_mean)["auc"]
    return result


def metrics(totals: dict[str, np.ndarray]) -> dict[str, Any]:
    frame = roc_metrics(totals["label"], totals["score"])
    video_labels, video_mean = video_scores(totals["video"], totals["label"], totals["score"])
    return {
        "auc_frame": frame["auc"],
        "auc_video": roc_metrics(video_labels, video_mean)["auc"],
        "eer": frame["eer"],
        "ap": frame["ap"],
        "acc": frame["acc"],
        **family_aucs(totals),
        "records": int(len(totals["score"])),
        "videos": int(len(video_labels)),
    }
