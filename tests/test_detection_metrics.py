"""Facing detection scores (issue 30): pycocotools' AP, AP50, AP75, AR@300 on ground truth and on
hand-worked cases where the IoU thresholds tell the answers apart; the count error per photo."""

import numpy as np
import pytest
from triskele.train.domains.merch.detection_metrics import coco_scores, count_errors

TRUTH = [np.array([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10], [60, 0, 70, 10]], np.float32),
         np.array([[0, 20, 20, 40], [30, 20, 50, 40]], np.float32)]


def shifted(boxes: np.ndarray, dx: float) -> np.ndarray:
    return boxes + np.array([dx, 0, dx, 0], np.float32)


def test_the_truth_itself_scores_one():
    got = coco_scores(TRUTH, TRUTH, [np.ones(4), np.ones(2)])
    assert got == {"ap": 1.0, "ap50": 1.0, "ap75": 1.0, "ar300": 1.0}


def test_boxes_at_iou_two_thirds_pass_ap50_and_fail_ap75():
    """Each box shifted right by a fifth of its width: IoU (0.8 w h) / (1.2 w h) = 2/3, so every
    detection is a true positive at IoU 0.50-0.65 (4 of the 10 thresholds) and a miss from 0.70."""
    boxes = [shifted(TRUTH[0], 2), shifted(TRUTH[1], 4)]
    got = coco_scores(TRUTH, boxes, [np.ones(4), np.ones(2)])
    assert got["ap50"] == pytest.approx(1.0) and got["ap75"] == 0.0
    assert got["ap"] == pytest.approx(0.4) and got["ar300"] == pytest.approx(0.4)


def test_a_missed_box_and_a_false_alarm_by_hand():
    """Image 1: three of its four boxes found (score 0.9) and one false alarm scored above them
    (0.95); image 2 found whole. Ranked: FP, then 5 TPs of 6 boxes. Precision at recall r is then
    5/6 for every r up to 5/6 (the interpolated envelope), nothing beyond: AP = (5/6) x (84/101)
    on COCO's 101 recall points (r = 0, 0.01, ..., 0.83 reached)."""
    found = [np.concatenate([TRUTH[0][:3], [[80, 50, 90, 60]]]), TRUTH[1]]
    scores = [np.array([0.9, 0.9, 0.9, 0.95]), np.array([0.9, 0.9])]
    got = coco_scores(TRUTH, found, scores)
    expected = (5 / 6) * (84 / 101)
    assert got["ap50"] == pytest.approx(expected, abs=1e-6) and got["ap"] == pytest.approx(expected, abs=1e-6)
    assert got["ar300"] == pytest.approx(5 / 6)


def test_no_detections_score_zero():
    empty = [np.zeros((0, 4)), np.zeros((0, 4))]
    assert coco_scores(TRUTH, empty, [np.zeros(0), np.zeros(0)]) == {"ap": 0.0, "ap50": 0.0, "ap75": 0.0,
                                                                    "ar300": 0.0}


def test_count_errors_per_photo():
    scores = [np.array([0.9, 0.8, 0.2, 0.6, 0.55]), np.array([0.1, 0.7])]  # 4 found of 4; 1 of 2
    got = count_errors(TRUTH, scores, threshold=0.5)
    assert got == {"count_mae": 0.5, "count_error": pytest.approx(1 / 6)}
