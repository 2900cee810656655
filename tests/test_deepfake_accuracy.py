"""Deepfake accuracy at 0.5 on a hand-worked case: the scikit-learn comparison
recomputes `(scores > 0.5) == labels` as the code does, on continuous scores that never sit on
the threshold, so a flipped comparison or a `>=` passed it."""

import numpy as np
import pytest
from triskele.train.domains.deepfake.metrics import roc_metrics


def test_accuracy_at_one_half_by_hand():
    # Reals 0.5 0.5 0.8, fakes 0.6 0.9 0.3. A score of exactly 0.5 is called real (fake needs > 0.5):
    # right are both 0.5 reals and the fakes 0.6 and 0.9: 4 of 6. Calling 0.5 fake (>=) gives 2 of 6,
    # the flipped comparison (< 0.5) 3 of 6, a threshold of 0.7 3 of 6.
    labels = np.array([0, 0, 0, 1, 1, 1])
    scores = np.array([0.5, 0.5, 0.8, 0.6, 0.9, 0.3], np.float32)
    assert roc_metrics(labels, scores)["acc"] == pytest.approx(4 / 6)
    # Every record right, and every record wrong.
    assert roc_metrics(labels, np.array([0.1, 0.5, 0.2, 0.51, 0.9, 0.7]))["acc"] == 1.0
    assert roc_metrics(labels, np.array([0.9, 0.51, 0.7, 0.5, 0.1, 0.2]))["acc"] == 0.0
