"""Facing detection scored as SKU-110K scores it: COCO's AP (IoU 0.50:0.95), AP50, AP75 and AR at
300 detections per image, computed by pycocotools (the maintained COCO evaluator, not a copy of
it), the score threshold from which a peak is a facing (chosen where detection F1 is highest), and
the count error per photo at it."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

import numpy as np
from triskele.train.domains.merch.alignment import shelf_facings
from triskele.train.domains.merch.recognition_metrics import match

MAX_DETECTIONS = 300
"""SKU-110K's detections per image for AP and AR (Goldman et al. 2019)."""
NAMES = ("ap", "ap50", "ap75", "ar300", "count_mae", "count_error", "score_threshold", "detection_f1")
LOWEST_SCORE = 0.05
"""Peaks below this are never facings: the threshold is chosen among the scores above it."""


def _xywh(boxes: np.ndarray) -> np.ndarray:
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)


def coco_scores(truth: Sequence[np.ndarray], boxes: Sequence[np.ndarray], scores: Sequence[np.ndarray],
                max_detections: int = MAX_DETECTIONS) -> dict[str, float]:
    """AP, AP50, AP75, AR@max_detections of class-agnostic detections: per image, the true boxes
    (N, 4) and the detected boxes (K, 4) with their scores (K,), all x1, y1, x2, y2 in pixels."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images = [{"id": i + 1} for i in range(len(truth))]
    annotations = [{"image_id": i + 1, "category_id": 1, "bbox": box, "area": box[2] * box[3], "iscrowd": 0}
                   for i, t in enumerate(truth) for box in _xywh(t).tolist()]
    for k, annotation in enumerate(annotations):
        annotation["id"] = k + 1
    gt = COCO()
    gt.dataset = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "facing"}]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    rows = [[i + 1, *box, score, 1] for i, (b, s) in enumerate(zip(boxes, scores, strict=True))
            for box, score in zip(_xywh(b).tolist(), np.asarray(s, np.float64).tolist(), strict=True)]
    if not rows or not annotations:
        return {"ap": 0.0, "ap50": 0.0, "ap75": 0.0, f"ar{max_detections}": 0.0}
    with contextlib.redirect_stdout(io.StringIO()):
        detections = gt.loadRes(np.asarray(rows, np.float64))
        evaluation = COCOeval(gt, detections, "bbox")
        evaluation.params.maxDets = [1, 100, max_detections]
        evaluation.params.areaRng = [[0, 1e10]] * 4  # facings are small: no COCO size classes
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    stats = evaluation.stats
    return {"ap": float(stats[0]), "ap50": float(stats[1]), "ap75": float(stats[2]),
            f"ar{max_detections}": float(stats[8])}


def count_errors(truth: Sequence[np.ndarray], boxes: Sequence[np.ndarray], scores: Sequence[np.ndarray],
                 threshold: float) -> dict[str, float]:
    """count_mae: mean |facings found - facings there| per photo; count_error: that as a share of
    the facings there (summed over photos). The facings found are predict's (`shelf_facings`)."""
    there = np.array([len(t) for t in truth], np.float64)
    found = np.array([len(shelf_facings(b, s, threshold)) for b, s in zip(boxes, scores, strict=True)], np.float64)
    return {"count_mae": float(np.mean(np.abs(found - there))),
            "count_error": float(np.sum(np.abs(found - there)) / max(np.sum(there), 1))}


def _ranked_hits(truth: Sequence[np.ndarray], boxes: Sequence[np.ndarray],
                 scores: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every photo's detections scoring LOWEST_SCORE or more, best first: (their scores, whether
    each matches a facing at IoU >= 0.5). Matched best first, as COCO matches, a detection's match
    does not depend on those below it, so the first i are the detections above any threshold."""
    hits, kept = [np.zeros(0, bool)], [np.zeros(0)]
    for t, b, s in zip(truth, boxes, scores, strict=True):
        s = np.asarray(s, np.float64)
        true = np.zeros(len(s), bool)
        true[[j for _, j in match(t, b, s, LOWEST_SCORE)]] = True
        hits.append(true[s >= LOWEST_SCORE])
        kept.append(s[s >= LOWEST_SCORE])
    score, hit = np.concatenate(kept), np.concatenate(hits)
    order = np.argsort(-score, kind="stable")
    return score[order], hit[order]


def threshold_scores(truth: Sequence[np.ndarray], boxes: Sequence[np.ndarray], scores: Sequence[np.ndarray],
                     given: float | None) -> dict[str, float]:
    """score_threshold: the peak score from which detections count as facings that makes the
    most of them right over all photos, the highest detection F1 = 2 TP / (kept + there) (the
    midpoint between two sorted scores); detection_f1 and the count errors at `given` or, unset,
    at that one (detection_f1 counts only the detections from LOWEST_SCORE up)."""
    score, hit = _ranked_hits(truth, boxes, scores)
    there = sum(len(t) for t in truth)
    f1 = 2 * np.cumsum(hit) / (np.arange(1, len(score) + 1) + max(there, 1))  # keeping the first i + 1
    if len(score) == 0:
        chosen = LOWEST_SCORE
    else:
        best = int(np.argmax(f1))
        chosen = float((score[best] + score[best + 1]) / 2 if best + 1 < len(score) else score[best] - 1e-6)
    used = chosen if given is None else given
    kept = int(np.sum(score >= used))
    return {"score_threshold": chosen, "detection_f1": float(f1[kept - 1]) if kept else 0.0,
            **count_errors(truth, boxes, scores, used)}
