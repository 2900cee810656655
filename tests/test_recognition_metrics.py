"""Recognition of detected facings and compliance: matching detections to true facings, the open-set
threshold and the scores, on cases worked by hand."""

import json

import numpy as np
import pytest
from triskele.train.domains.merch.compliance_metrics import sku_names, status_scores
from triskele.train.domains.merch.recognition_metrics import best_threshold, match, pairwise_iou, recognition_scores

TRUTH = np.array([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], np.float32)


def test_pairwise_iou_by_hand():
    iou = pairwise_iou(np.array([[0, 0, 10, 10]]), np.array([[5, 0, 15, 10], [0, 0, 10, 10], [10, 10, 20, 20]]))
    np.testing.assert_allclose(iou, [[50 / 150, 1.0, 0.0]])


def test_each_true_facing_takes_the_best_scoring_detection_once():
    boxes = np.array([[1, 0, 11, 10],    # on facing 0, score 0.6
                      [0, 0, 10, 10],    # on facing 0 exactly, score 0.9: it takes facing 0
                      [20, 0, 30, 10],   # facing 1, but below the threshold
                      [44, 0, 54, 10],   # facing 2 at IoU 6/14 < 0.5
                      [40, 0, 50, 11]], np.float32)  # facing 2 at IoU 10/11
    scores = np.array([0.6, 0.9, 0.2, 0.8, 0.5])
    assert match(TRUTH, boxes, scores, threshold=0.3) == [(0, 1), (2, 4)]
    assert match(TRUTH, boxes, scores, threshold=0.0) == [(0, 1), (2, 4), (1, 2)]
    assert match(TRUTH[:0], boxes, scores, threshold=0.0) == []


def test_the_threshold_separates_facings_recognised_right_from_the_rest():
    tau, accuracy = best_threshold(np.array([0.9, 0.3, 0.8, 0.2]), np.array([True, False, True, False]))
    assert tau == pytest.approx(0.55) and accuracy == 1.0
    # One right facing below a wrong one: the best cut gets 3 of 4.
    tau, accuracy = best_threshold(np.array([0.9, 0.5, 0.6, 0.2]), np.array([True, True, False, False]))
    assert accuracy == 0.75 and (tau < 0.5 or 0.6 < tau < 0.9)
    # All right: accept everything.
    tau, accuracy = best_threshold(np.array([0.4, 0.7]), np.array([True, True]))
    assert tau < 0.4 and accuracy == 1.0


def test_recognition_scores_by_hand():
    true_skus = np.array([4, 5, -1])  # facing 2 is foreign
    boxes = TRUTH + 0.1
    scores = np.array([0.9, 0.9, 0.9])
    skus = np.array([4, 6, 4])  # facing 1 named wrongly, the foreign one named 4
    cosines = np.array([0.95, 0.5, 0.4])
    got = recognition_scores([TRUTH], [true_skus], [boxes], [scores], [skus], [cosines], threshold=0.5)
    assert got["sku_top1"] == 0.5  # of the 2 known facings
    # Rejecting below 0.95: facing 0 accepted and right, facings 1 (wrong) and 2 (foreign) unknown: all right.
    assert got["open_set_accuracy"] == 1.0 and 0.5 < got["unknown_threshold"] < 0.95


def test_per_status_f1_by_hand():
    truth = [["ok", "ok", "misplaced", None], ["out_of_stock", "ok"]]
    found = [["ok", "misplaced", "misplaced", None], ["out_of_stock", "missing"]]
    got = status_scores(truth, found)
    assert got["f1_ok"] == pytest.approx(2 * 1 / (2 * 1 + 2))  # 1 right, 2 ok facings called otherwise
    assert got["f1_misplaced"] == pytest.approx(2 / 3) and got["f1_out_of_stock"] == 1.0
    assert got["f1_missing"] == 0.0 and got["f1_foreign"] == 1.0  # none on either side


def test_sku_names_as_the_plan_names_them():
    assert sku_names(np.array([3, -1, 12])) == ["3", "foreign", "12"]
    assert sku_names(np.array([3, 4]), np.array([0.9, 0.2]), unknown=0.5) == ["3", None]


def test_perfect_perception_scores_full_compliance_and_a_misread_facing_does_not():
    from triskele.train.domains.merch.compliance_metrics import compliance_scores
    from triskele.train.domains.merch.shelf_photos import ShelfPhotos

    source = ShelfPhotos("val", 2, 128, min_facings=30, max_boxes=200)
    records = [source.load(i) for i in range(2)]
    totals = {k: np.stack([r[k] for r in records]) for k in ("boxes", "box_valid", "box_sku")}
    totals = {"true_boxes": totals["boxes"], "box_valid": totals["box_valid"], "true_skus": totals["box_sku"],
              "boxes": totals["boxes"], "scores": totals["box_valid"], "sku": totals["box_sku"],
              "sku_cosine": np.ones_like(totals["box_valid"]),
              "planograms": np.array([json.dumps(source.photo(i).planogram) for i in range(2)])}
    perfect = compliance_scores(totals, score_threshold=0.5, unknown=0.5)
    assert perfect == {**dict.fromkeys(perfect, 1.0), "score_mae": 0.0}
    misread = dict(totals, sku=np.where(totals["sku"] >= 0, (totals["sku"] + 1) % 100, -1))
    worse = compliance_scores(misread, score_threshold=0.5, unknown=0.5)
    assert worse["f1_ok"] < 0.5 and worse["score_mae"] > 0.3
