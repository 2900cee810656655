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
    # The EER as DeepfakeBench reads it: the FPR of scikit-learn's ROC point where |FNR - FPR| is
    # smallest. Here 0.28444; that point's FNR, the value a slip to the other curve gives, is 0.28727
    # (a gap of 0.0028): the two must agree to round-off.
    fpr, tpr, _ = skm.roc_curve(labels, scores)
    closest = np.argmin(np.abs((1 - tpr) - fpr))
    assert abs(fpr[closest] - (1 - tpr[closest])) > 0.002, "the case must tell the two curves apart"
    assert got["eer"] == pytest.approx(fpr[closest], abs=1e-12)


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


def test_eer_by_hand_where_the_two_rates_differ_at_the_closest_point():
    # Real scores 0.1 0.2 0.3 0.6, fake 0.5 0.7 0.8. The ROC points (FPR, FNR) by threshold:
    # inf (0, 1), 0.8 (0, 2/3), 0.7 (0, 1/3), 0.6 (1/4, 1/3), 0.5 (1/4, 0), 0.1 (1, 0). |FNR - FPR|
    # is smallest, 1/12, at 0.6, where FPR = 1/4 and FNR = 1/3: the EER is the FPR there, 0.25,
    # not the FNR (0.333) nor their mean (0.292).
    labels = np.array([0, 0, 0, 0, 1, 1, 1])
    scores = np.array([0.1, 0.2, 0.3, 0.6, 0.5, 0.7, 0.8])
    got = roc_metrics(labels, scores)
    assert got["eer"] == pytest.approx(1 / 4, abs=1e-12)
    assert got["auc"] == pytest.approx(11 / 12)  # 0.5 beats 3 reals, 0.7 and 0.8 beat all 4: 11 of 12 pairs
    assert got["ap"] == pytest.approx((1 / 1 + 2 / 2 + 3 / 4) / 3)  # precision at each fake: 0.8, 0.7, 0.5
    assert got["acc"] == pytest.approx(5 / 7)  # the fake at 0.5 and the real at 0.6 are wrong


def test_family_video_aucs_score_each_familys_videos_against_the_reals():
    # 30 videos of 4 frames, records shuffled: 12 real, then 6 each of families A, B, C (B easy, C
    # hard). Expected: per family, the mean score of each of its videos and of every real video,
    # scored by scikit-learn. Here A 0.889, B 1.000, C 0.639 against 0.843 for all videos together
    # (what a slip to every video gives each family): every family is at least 0.04 away from it.
    rng = np.random.default_rng(7)
    family = np.repeat(np.r_[np.zeros(12, int), np.full(6, 1), np.full(6, 2), np.full(6, 3)], 4)
    video = np.repeat(np.arange(30), 4)
    score = np.clip(rng.normal(0.4 + np.array([0.0, 0.1, 0.35, 0.0])[family], 0.2), 0, 1)
    order = rng.permutation(len(video))
    video, family, score = video[order], family[order], score[order]
    label = (family > 0).astype(int)
    totals = {"video": video, "label": label, "score": score, "family": family,
              "family_names": np.array(["real", "A", "B", "C"])}
    result = metrics(totals)

    def per_video(chosen):
        ids = sorted(set(video[chosen].tolist()))
        return [int(label[video == v][0]) for v in ids], [float(score[video == v].mean()) for v in ids]

    every_video = skm.roc_auc_score(*per_video(np.ones(len(video), bool)))
    assert result["auc_video"] == pytest.approx(every_video, abs=1e-12)
    for code, name in enumerate(["A", "B", "C"], start=1):
        chosen = (family == 0) | (family == code)
        expected = skm.roc_auc_score(*per_video(chosen))
        assert abs(expected - every_video) > 0.04, "the case must tell a family from all videos"
        assert result[f"auc_video/{name}"] == pytest.approx(expected, abs=1e-12), name
        assert result[f"auc_frame/{name}"] == pytest.approx(skm.roc_auc_score(label[chosen], score[chosen]),
                                                            abs=1e-12), name
    assert {k for k in result if "/" in k} == {f"auc_{level}/{n}" for level in ("frame", "video") for n in "ABC"}


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
