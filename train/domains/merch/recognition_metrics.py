"""Recognition of detected facings: each true facing matched to at most one detection (IoU >= 0.5,
higher scores first, as COCO matches), then the matched facings' SKUs judged: top-1 among the
known ones, and the open-set threshold, the cosine below which a facing is `unknown`, chosen where
it best tells known facings recognised right from foreign ones."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MATCH_IOU = 0.5
NAMES = ("sku_top1", "open_set_accuracy", "unknown_threshold")


def pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of `a` (N, 4) with every box of `b` (M, 4), x1, y1, x2, y2: (N, M)."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    low, high = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=-1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=-1)
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-12)


def match(truth: np.ndarray, boxes: np.ndarray, scores: np.ndarray, threshold: float,
          min_iou: float = MATCH_IOU) -> list[tuple[int, int]]:
    """(true facing, detection) pairs: detections scoring at least `threshold`, best first, each
    taking the unmatched true facing it overlaps most, if by `min_iou` or more."""
    keep = np.flatnonzero(np.asarray(scores) >= threshold)
    order = keep[np.argsort(-np.asarray(scores)[keep], kind="stable")]
    iou = pairwise_iou(truth, np.asarray(boxes)[order])
    taken = np.zeros(len(truth), bool)
    pairs = []
    for column, detection in enumerate(order):
        candidates = np.where(taken, -1.0, iou[:, column]) if len(truth) else np.zeros(0)
        if len(candidates) and candidates.max() >= min_iou:
            best = int(np.argmax(candidates))
            taken[best] = True
            pairs.append((best, int(detection)))
    return pairs


def best_threshold(cosines: np.ndarray, accepted_right: np.ndarray) -> tuple[float, float]:
    """(threshold, accuracy): the cosine from which a facing is accepted as its nearest SKU that
    makes the most facings right, a facing being right when accepted and `accepted_right`, or
    rejected and not; candidates: midpoints between the sorted cosines."""
    if len(cosines) == 0:
        return 0.0, 0.0
    order = np.argsort(cosines, kind="stable")
    c, right = np.asarray(cosines, np.float64)[order], np.asarray(accepted_right, bool)[order]
    candidates = np.concatenate([[c[0] - 1e-6], (c[1:] + c[:-1]) / 2, [c[-1] + 1e-6]])
    # Threshold candidates[i] rejects the first i facings and accepts the rest.
    rejected_right = np.concatenate([[0], np.cumsum(~right)])
    accepted = np.concatenate([np.cumsum(right[::-1])[::-1], [0]])
    correct = rejected_right + accepted
    best = int(np.argmax(correct))
    return float(candidates[best]), float(correct[best] / len(c))


def recognition_scores(truth: Sequence[np.ndarray], true_skus: Sequence[np.ndarray], boxes: Sequence[np.ndarray],
                       scores: Sequence[np.ndarray], skus: Sequence[np.ndarray], cosines: Sequence[np.ndarray],
                       threshold: float) -> dict[str, float]:
    """sku_top1: the matched known facings given their SKU; open_set_accuracy at unknown_threshold:
    the matched facings right once those below it are called unknown (foreign ones: SKU -1)."""
    known_right, is_known, cosine = [], [], []
    for t, t_sku, b, s, sku, cos in zip(truth, true_skus, boxes, scores, skus, cosines, strict=True):
        for i, j in match(t, b, s, threshold):
            is_known.append(t_sku[i] >= 0)
            known_right.append(t_sku[i] >= 0 and sku[j] == t_sku[i])
            cosine.append(cos[j])
    known = np.asarray(is_known, bool)
    right = np.asarray(known_right, bool)
    top1 = float(right[known].mean()) if known.any() else 0.0
    tau, accuracy = best_threshold(np.asarray(cosine, np.float64), right)
    return {"sku_top1": top1, "open_set_accuracy": accuracy, "unknown_threshold": tau}
