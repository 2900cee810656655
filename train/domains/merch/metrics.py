"""Merchandising metrics: closed-set top-k, open-set retrieval, planogram compliance."""

from __future__ import annotations

from typing import Any

import numpy as np
from triskele.train.domains.merch.data import CLOSED, FACING, GALLERY, QUERY, SHELF_GALLERY

NAMES = ("top1", "top5", "recall_at_1", "recall_at_5", "map", "facing_acc", "violation_precision",
         "violation_recall", "compliance", "true_compliance")


def hits_at_k(matches: np.ndarray, k: int) -> np.ndarray:
    """From each row's matches by rank (bool), the share of rows with a match among the first j
    ranks, j = 1..k."""
    return np.logical_or.accumulate(np.asarray(matches)[:, :k], axis=1).mean(axis=0)


def topk_accuracy(top: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(top-1, top-5) accuracy from each record's ranked class indices."""
    at = hits_at_k(np.asarray(top) == np.asarray(labels)[:, None], 5)
    return float(at[0]), float(at[-1])


def ranked_matches(queries: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray,
                   gallery_labels: np.ndarray) -> np.ndarray:
    """(query, rank): whether the query's rank-th cosine nearest gallery image (embeddings
    unit-norm) is of its SKU."""
    similarity = np.asarray(queries) @ np.asarray(gallery).T
    order = np.argsort(-similarity, axis=1, kind="stable")
    return np.asarray(gallery_labels)[order] == np.asarray(query_labels)[:, None]


def retrieval_metrics(queries: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray,
                      gallery_labels: np.ndarray) -> dict[str, float]:
    """Recall@1, recall@5 and mAP of cosine nearest-neighbour search (embeddings unit-norm)."""
    relevant = ranked_matches(queries, query_labels, gallery, gallery_labels)
    ranks = np.arange(1, relevant.shape[1] + 1)
    precision_at = np.cumsum(relevant, axis=1) / ranks
    count = relevant.sum(axis=1)
    ap = np.where(count > 0, (precision_at * relevant).sum(axis=1) / np.maximum(count, 1), 0.0)
    recall = hits_at_k(relevant, 5)
    return {"recall_at_1": float(recall[0]), "recall_at_5": float(recall[-1]), "map": float(ap.mean())}


def nearest_labels(queries: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray) -> np.ndarray:
    return np.asarray(gallery_labels)[np.argmax(np.asarray(queries) @ np.asarray(gallery).T, axis=1)]


def violations(predicted: np.ndarray, expected: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flagged: the prediction differs from the planogram, a true violation: what is there differs)."""
    return np.asarray(predicted) != np.asarray(expected), np.asarray(actual) != np.asarray(expected)


def planogram_metrics(predicted: np.ndarray, expected: np.ndarray, actual: np.ndarray,
                      shelf: np.ndarray) -> dict[str, float]:
    """Facing accuracy (prediction = what is there), violations flagged (prediction != planogram)
    against true violations (what is there != planogram), and the shelf compliance score (mean
    over shelves of the share of facings judged compliant)."""
    predicted, expected, actual, shelf = map(np.asarray, (predicted, expected, actual, shelf))
    flagged, violation = violations(predicted, expected, actual)
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


def facings(totals: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The shelf facings' predicted SKU (nearest shelf-gallery image), planned SKU, actual SKU
    and shelf; None without facings and a shelf gallery."""
    kind, label, emb = totals["kind"], totals["label"], totals["embedding"]
    facing, shelf_gallery = kind == FACING, kind == SHELF_GALLERY
    if not (facing.any() and shelf_gallery.any()):
        return None
    return {"predicted": nearest_labels(emb[facing], emb[shelf_gallery], label[shelf_gallery]),
            "expected": totals["expected"][facing], "actual": label[facing], "shelf": totals["shelf"][facing]}


def _sets(totals: dict[str, np.ndarray]) -> tuple[np.ndarray | None, tuple[np.ndarray, np.ndarray] | None]:
    """(the closed-set records, (the open-set queries, their gallery)) as masks, None where absent."""
    kind = totals["kind"]
    closed, query, gallery = kind == CLOSED, kind == QUERY, kind == GALLERY
    return closed if closed.any() else None, (query, gallery) if query.any() and gallery.any() else None


def at_k(totals: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """Closed-set top-j accuracy ('top-k', j up to the 5 ranks a record keeps) and open-set
    retrieval recall@j ('recall@k'), j = 1..k, where the split has those records."""
    closed, open_set = _sets(totals)
    label, emb = totals["label"], totals["embedding"]
    curves = {}
    if closed is not None:
        curves["top-k"] = hits_at_k(totals["top5"][closed] == label[closed][:, None], k)
    if open_set is not None:
        query, gallery = open_set
        curves["recall@k"] = hits_at_k(ranked_matches(emb[query], label[query], emb[gallery], label[gallery]), k)
    return curves


def metrics(totals: dict[str, np.ndarray]) -> dict[str, Any]:
    label, emb = totals["label"], totals["embedding"]
    result: dict[str, Any] = {}
    closed, open_set = _sets(totals)
    if closed is not None:
        result["top1"], result["top5"] = topk_accuracy(totals["top5"][closed], label[closed])
    if open_set is not None:
        query, gallery = open_set
        result.update(retrieval_metrics(emb[query], label[query], emb[gallery], label[gallery]))
    shelf = facings(totals)
    if shelf is not None:
        result.update(planogram_metrics(**shelf))
    return result
