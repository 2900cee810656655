import numpy as np
import pytest
from sklearn import metrics as skm
from triskele.train.domains.deepfake.metrics import metrics, roc_metrics, video_scores


def test_metrics_match_scikit_learn_on_random_scores():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    scores = np.clip(rng.normal(0.35 + 0.3 * labels, 0.25), 0, 1)
    got = roc_metrics(labels, scores)
    assert got["auc"] == pytest.approx(skm.roc_auc_score(labels, scores))
    assert got["ap"] == pytest.approx(skm.average_precision_score(labels, scores))
    assert got["acc"] == pytest.approx(((scores > 0.5) == labels).mean())
    assert 0.1 < got["eer"] < 0.45


def test_eer_by_hand():
    # Real scores 0.1 0.2 0.3 0.6, fake 0.4 0.7 0.8 0.9: at threshold 0.7 the ROC point is
    # FPR 0/4 -> at 0.6, FPR 1/4 and FNR 1/4 (fake 0.4 missed): the EER is 0.25.
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    scores = np.array([0.1, 0.2, 0.3, 0.6, 0.4, 0.7, 0.8, 0.9])
    got = roc_metrics(labels, scores)
    assert got["eer"] == pytest.approx(0.25)
    assert got["auc"] == pytest.approx(15 / 16)
    assert got["acc"] == pytest.approx(6 / 8)
    assert roc_metrics(labels, labels.astype(float))["eer"] == 0.0


def test_video_aggregation_averages_frames_per_video():
    videos = np.array([3, 3, 3, 8, 8, 5])
    labels = np.array([1, 1, 1, 0, 0, 1])
    scores = np.array([0.9, 0.3, 0.6, 0.2, 0.4, 0.1])
    video_labels, mean = video_scores(videos, labels, scores)
    np.testing.assert_array_equal(video_labels, [1, 1, 0])  # videos sorted: 3, 5, 8
    np.testing.assert_allclose(mean, [0.6, 0.1, 0.3])
    result = metrics({"video": videos, "label": labels, "score": scores})
    assert result["videos"] == 3 and result["records"] == 6
    assert result["auc_video"] == pytest.approx(skm.roc_auc_score([1, 1, 0], [0.6, 0.1, 0.3]))
    assert result["auc_frame"] == pytest.approx(skm.roc_auc_score(labels, scores))


def test_single_class_split_is_a_clear_error():
    with pytest.raises(ValueError, match="needs real and fake records"):
        roc_metrics(np.zeros(4), np.linspace(0, 1, 4))
