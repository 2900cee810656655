"""Facing detection scores: pycocotools' AP, AP50, AP75, AR@300 on ground truth and on
hand-worked cases where the IoU thresholds tell the answers apart; the count error per photo; the
score threshold chosen where detection F1 is highest."""

import numpy as np
import pytest
from triskele.train.domains.merch.detection_metrics import coco_scores, count_errors, threshold_scores

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
    boxes = [np.concatenate([TRUTH[0], [[80, 0, 90, 10]]]), TRUTH[1]]
    got = count_errors(TRUTH, boxes, scores, threshold=0.5)
    assert got == {"count_mae": 0.5, "count_error": pytest.approx(1 / 6)}


def test_the_score_threshold_is_chosen_where_detection_f1_is_highest():
    """Image 1: its four boxes at 0.9, 0.8, 0.7, 0.6 and a false alarm at 0.65; image 2: its two
    boxes at 0.5 and 0.2 and false alarms at 0.4 and 0.3. Keeping the best i of the nine gives TP
    1, 2, 3, 3, 4, 5, 5, 5, 6 and F1 = 2 TP / (i + 6) is highest, 10/12, at i = 6: the threshold
    is the midpoint 0.45 of 0.5 and 0.4, where image 1 shows 5 of its 4 and image 2 1 of its 2.
    Given 0.75 instead: two kept, both right, F1 4/8, and 2 of 4 and 0 of 2 found."""
    false_alarm = np.array([[80, 50, 90, 60]], np.float32)
    boxes = [np.concatenate([TRUTH[0], false_alarm]), np.concatenate([TRUTH[1], false_alarm, false_alarm])]
    scores = [np.array([0.9, 0.8, 0.7, 0.6, 0.65]), np.array([0.5, 0.2, 0.4, 0.3])]
    got = threshold_scores(TRUTH, boxes, scores, None)
    assert got["score_threshold"] == pytest.approx(0.45) and got["detection_f1"] == pytest.approx(10 / 12)
    assert got["count_mae"] == pytest.approx(1.0) and got["count_error"] == pytest.approx(2 / 6)
    given = threshold_scores(TRUTH, boxes, scores, 0.75)
    assert given["score_threshold"] == pytest.approx(0.45)  # what this split would choose, whatever is given
    assert given["detection_f1"] == pytest.approx(4 / 8) and given["count_mae"] == pytest.approx(2.0)


def test_no_detections_leave_the_lowest_threshold_and_f1_zero():
    empty = [np.zeros((0, 4)), np.zeros((0, 4))]
    got = threshold_scores(TRUTH, empty, [np.zeros(0), np.zeros(0)], None)
    assert got == {"score_threshold": 0.05, "detection_f1": 0.0, "count_mae": 3.0, "count_error": 1.0}
