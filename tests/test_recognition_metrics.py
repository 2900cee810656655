"""Recognition of detected facings (issue 30): matching detections to true facings, the open-set
threshold and the scores, on cases worked by hand."""

import numpy as np
import pytest
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
