"""Merchandising metrics: closed-set top-k, open-set retrieval, planogram compliance."""

from __future__ import annotations

from typing import Any

import numpy as np
from triskele.train.domains.merch.data import CLOSED, FACING, GALLERY, QUERY, SHELF_GALLERY

NAMES = ("top1", "top5", "recall_at_1", "recall_at_5", "map", "facing_acc", "violation_precision",
         "violation_recall", "compliance", "true_compliance")


def topk_accuracy(top: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(top-1, top-5) accuracy from each record's ranked class indices."""
    hits = np.asarray(top) == np.asarray(labels)[:, None]
    return float(hits[:, 0].mean()), float(hits[:, :5].any(axis=1).mean())


def retrieval_metrics(queries: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray,
                      gallery_labels: np.ndarray) -> dict[str, float]:
    """Recall@1, recall@5 and mAP of cosine nearest-neighbour search (embeddings unit-norm)."""
    similarity = np.asarray(queries) @ np.asarray(gallery).T
    order = np.argsort(-similarity, axis=1, kind="stable")
    relevant = np.asarray(gallery_labels)[order] == np.asarray(query_labels)[:, None]
    ranks = np.arange(1, relevant.shape[1] + 1)
    precision_at = np.cumsum(relevant, axis=1) / ranks
    count = relevant.sum(axis=1)
    ap = np.where(count > 0, (precision_at * relevant).sum(axis=1) / np.maximum(count, 1), 0.0)
    return {"recall_at_1": float(relevant[:, 0].mean()), "recall_at_5": float(relevant[:, :5].any(axis=1).mean()),
            "map": float(ap.mean())}


def nearest_labels(queries: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray) -> np.ndarray:
    return np.asarray(gallery_labels)[np.argmax(np.asarray(queries) @ np.asarray(gallery).T, axis=1)]


def planogram_metrics(predicted: np.ndarray, expected: np.ndarray, actual: np.ndarray,
                      shelf: np.ndarray) -> dict[str, float]:
    """Facing accuracy (prediction = what is there), violations flagged (prediction != planogram)
    against true violations (what is there != planogram), and the shelf compliance score (mean
    over shelves of the share of facings judged compliant)."""
    predicted, expected, actual, shelf = map(np.asarray, (predicted, expected, actual, shelf))
    flagged, violation = predicted != expected, actual != expected
    caught = (flagged & violation).sum()
    compliant = ~flagged
    shelves = np.unique(shelf)
    return {
        "facing_acc": float((predicted == actual).mean()),
        "violation_precision": float(caught / flagged.sum()) if flagged.any() else 1.0,
        "violation_recall": float(caught / violation.sum()) if violation.any() else 1.0,
        "compliance": float(np.mean([compliant[shelf == s].mean() for s in shelves])),
        "true_compliance": float(np.mean([(~violation)[shelf == s].mean() for s in shelves])),
    }


def metrics(totals: dict[str, np.ndarray]) -> dict[str, Any]:
    kind, label, emb = totals["kind"], totals["label"], totals["embedding"]
    result: dict[str, Any] = {}
    closed = kind == CLOSED
    if closed.any():
        result["top1"], result["top5"] = topk_accuracy(totals["top5"][closed], label[closed])
    query, gallery = kind == QUERY, kind == GALLERY
    if query.any() and gallery.any():
        result.update(retrieval_metrics(emb[query], label[query], emb[gallery], label[gallery]))
    facing, shelf_gallery = kind == FACING, kind == SHELF_GALLERY
    if facing.any() and shelf_gallery.any():
        predicted = nearest_labels(emb[facing], emb[shelf_gallery], label[shelf_gallery])
        result.update(planogram_metrics(predicted, totals["expected"][facing], label[facing], totals["shelf"][facing]))
    return result
