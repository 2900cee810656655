"""Face crops aligned on 5 landmarks as DeepfakeBench's preprocessing makes them: the least-squares
similarity (rotation, uniform scale, shift) that takes the face's eyes, nose tip and mouth (68-point
indices 37, 44, 30, 49, 55, DeepfakeBench's picks) to ArcFace's 112-pixel template, scaled to the
crop with DeepfakeBench's 1.3x margin, then the frame warped by it (bilinear, black outside)."""

from __future__ import annotations

import numpy as np

ALIGNMENT_POINTS = (37, 44, 30, 49, 55)
"""The 68-point landmarks DeepfakeBench aligns on: eyes (upper lids), nose tip, mouth (both sides)."""
_ARCFACE_112 = np.array([[30.2946, 51.6963], [65.5318, 51.5014], [48.0252, 71.7366], [33.5493, 92.3655],
                         [62.7299, 92.2041]])
"""ArcFace's 5-point template for a 96 x 112 face (x, y), which DeepfakeBench widens to 112 x 112."""


def alignment_template(size: int, enlarge: float) -> np.ndarray:
    """Where the 5 alignment points go in a size x size crop (DeepfakeBench's `img_align_crop`:
    the 112-px template shifted 8 px right, scaled to `size`, then shrunk about the crop's corner so
    that the crop holds `enlarge` times the template's face)."""
    points = (_ARCFACE_112 + [8.0, 0.0]) * size / 112
    margin = size * (enlarge - 1) / 2
    return (points + margin) * size / (size + 2 * margin)


def similarity_transform(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The 2 x 3 similarity (no reflection) that maps `source` points (N, 2) closest to `target`
    in least squares (Umeyama 1991, as scikit-image's SimilarityTransform estimates it)."""
    source, target = np.asarray(source, np.float64), np.asarray(target, np.float64)
    mean_s, mean_t = source.mean(0), target.mean(0)
    centred_s, centred_t = source - mean_s, target - mean_t
    u, singular, vt = np.linalg.svd(centred_t.T @ centred_s / len(source))
    sign = np.diag([1.0, np.sign(np.linalg.det(u) * np.linalg.det(vt)) or 1.0])
    rotation = u @ sign @ vt
    scale = np.trace(np.diag(singular) @ sign) / centred_s.var(0).sum()
    return np.hstack([scale * rotation, (mean_t - scale * rotation @ mean_s)[:, None]])


def apply_transform(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Points (N, 2) moved by a 2 x 3 affine `matrix`."""
    return np.asarray(points, np.float64) @ matrix[:, :2].T + matrix[:, 2]


def aligned_crop(frame: np.ndarray, landmarks: np.ndarray, size: int, enlarge: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(size x size RGB crop of `frame` aligned on the 5 points of its 68 `landmarks`, the 68
    landmarks in the crop's pixels)."""
    from triskele.train.domains.deepfake.video import opencv

    cv2 = opencv()
    matrix = similarity_transform(landmarks[list(ALIGNMENT_POINTS)], alignment_template(size, enlarge))
    crop = cv2.warpAffine(np.ascontiguousarray(frame), matrix, (size, size), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return crop, apply_transform(matrix, landmarks).astype(np.float32)
