"""Compliance judged on evaluation photos: each photo's planned facings given a status twice, from
the detector's facings (`shelf_facings`, as predict finds them) and recognised SKUs, and from the
true boxes and SKUs through the same rows and alignment (what perfect perception would report; a
found facing may be read as any of its nearest SKUs within `PLAN_MARGIN` of its nearest); per
status the precision, recall and F1 of the first against the second over all planned facings, and
the mean absolute error of the score."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
from triskele.train.domains.merch.alignment import near_skus, shelf_facings, shelf_report

JUDGED = ("ok", "misplaced", "foreign", "out_of_stock", "missing")
"""Statuses a planned facing can have (`extra` is a found facing's, with no planned place)."""
NAMES = tuple(f"f1_{s}" for s in JUDGED) + ("score_mae",)


def planned_statuses(report: dict) -> list[str | None]:
    """Each planned facing's status, shelf by shelf (None: planned empty, or out of view)."""
    return [status for row in report["rows"] for status in row["planned"]]


def sku_names(skus: np.ndarray, cosines: np.ndarray | None = None, unknown: float = 0.0) -> list[str | None]:
    """SKU indices as the plan names them; -1 (a foreign product) as 'foreign', one below `unknown`
    cosine as None (unrecognised)."""
    names = ["foreign" if s < 0 else str(int(s)) for s in np.asarray(skus)]
    if cosines is None:
        return names
    return [n if c >= unknown else None for n, c in zip(names, np.asarray(cosines), strict=True)]


def status_scores(truth: Sequence[Sequence[str | None]], found: Sequence[Sequence[str | None]]) -> dict[str, float]:
    """f1_<status> per JUDGED status over every planned facing of every photo (1.0 where neither
    side has the status), from per-photo lists of planned statuses in the same order."""
    t = np.array([s or "" for photo in truth for s in photo], dtype=object)
    f = np.array([s or "" for photo in found for s in photo], dtype=object)
    scores = {}
    for status in JUDGED:
        tp = int(np.sum((t == status) & (f == status)))
        wrong = int(np.sum((t == status) != (f == status)))
        scores[f"f1_{status}"] = 1.0 if tp + wrong == 0 else 2 * tp / (2 * tp + wrong)
    return scores


def compliance_scores(totals: dict, score_threshold: float, unknown: float,
                      width: float | None = None) -> dict[str, float]:
    """The per-status F1 and score_mae of an evaluation's totals (`planograms`: each photo's plan as
    JSON); `width`: the photos', whose edges may cut their rows (`shelf_report`)."""
    truth_statuses, found_statuses, errors = [], [], []
    for i, plan_json in enumerate(totals["planograms"]):
        shelves = [[str(s) if s is not None else None for s in shelf] for shelf in json.loads(str(plan_json))]
        valid = totals["box_valid"][i] > 0
        true_boxes = totals["true_boxes"][i][valid]
        truth = shelf_report(true_boxes, np.ones(len(true_boxes)), sku_names(totals["true_skus"][i][valid]),
                             [None] * len(true_boxes), shelves, width=width)
        keep = shelf_facings(totals["boxes"][i], totals["scores"][i], score_threshold)
        accepts = None
        if "sku_candidates" in totals:
            candidates = totals["sku_candidates"][i][keep]
            names = np.asarray(sku_names(candidates.reshape(-1)), object).reshape(candidates.shape)
            accepts = near_skus(names, totals["sku_candidate_cosines"][i][keep], unknown)
        found = shelf_report(totals["boxes"][i][keep], totals["scores"][i][keep],
                             sku_names(totals["sku"][i][keep], totals["sku_cosine"][i][keep], unknown),
                             [None] * len(keep), shelves, accepts, width)
        truth_statuses.append(planned_statuses(truth))
        found_statuses.append(planned_statuses(found))
        errors.append(abs(found["score"] - truth["score"]))
    return {**status_scores(truth_statuses, found_statuses), "score_mae": float(np.mean(errors))}
