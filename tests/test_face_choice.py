"""The face a person would pick: in a video of scikit-image's astronaut portrait dlib also finds the
mission patch on the suit, as large a box as the face or larger, but scored under 0.1 against the
face's 1.5; the track is
chosen by size, the detector's confidence and the frames it is in, so the face wins in predict and
in prepare alike, and a face in more frames wins over a larger one seen once."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("dlib", reason="face detection needs dlib (pip install dlib-bin)")
pytest.importorskip("cv2", reason="video decoding needs OpenCV (pip install 'opencv-python-headless<5')")
pytest.importorskip("skimage", reason="the portrait is scikit-image's sample photograph")

from triskele.train.config.schema import InputLimits  # noqa: E402
from triskele.train.domains.deepfake.faces import (  # noqa: E402
    landmarks_hold,
    main_track,
    photo_face,
    scored_faces,
    video_faces,
)
from triskele.train.domains.deepfake.prepare import prepare_video  # noqa: E402
from videoutil import FACE, photograph, write_video  # noqa: E402

PATCH = (123, 330, 227, 434)
"""Where the mission patch lies on the suit (the box the largest-area rule followed)."""


def centre(box):
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def near(box, known, tolerance=0.15):
    side = known[2] - known[0]
    return all(abs(a - b) < tolerance * side for a, b in zip(centre(box), centre(known), strict=True))


def decoded_frames(video):
    import cv2

    capture, frames = cv2.VideoCapture(str(video)), []
    while (read := capture.read())[0]:
        frames.append(np.ascontiguousarray(read[1][..., ::-1]))
    return frames


def test_a_still_portrait_video_tracks_the_face_not_the_patch_in_predict_and_prepare(tmp_path):
    video = write_video(tmp_path / "raw" / "portrait.mp4", [photograph()] * 8)
    found = scored_faces(decoded_frames(video)[0])  # the premise, from dlib itself
    face = [score for box, score in found if near(box, FACE)]
    patch = [(box, score) for box, score in found if near(box, PATCH, 0.3)]
    assert len(face) == 1 and len(patch) == 1, found
    (box, patch_score), = patch
    assert face[0] > 1.0 > 0.5 > patch_score and (box[2] - box[0]) > FACE[2] - FACE[0], found
    faces = video_faces(video, 8, crops="box")
    assert len(faces.boxes) == 8 and all(near(box, FACE) for box in faces.boxes), faces.boxes
    print("astronaut portrait: chosen box", faces.boxes[0], "dlib's face", FACE)
    entry = prepare_video((video, tmp_path / "raw", tmp_path / "out", 8, 256, InputLimits(), "box"))
    assert entry["frames_written"] == 8, entry
    crops = sorted((tmp_path / "out").rglob("*.png"))
    assert len(crops) == 8
    from PIL import Image

    for path, crop in zip(crops, faces.crops, strict=True):
        np.testing.assert_array_equal(np.asarray(Image.open(path)), crop)  # prepare and predict agree
    in_crop = scored_faces(np.asarray(Image.open(crops[0])))
    assert in_crop and max(score for _, score in in_crop) > 1.0  # the crop holds the face, surely found


def test_a_still_photo_gets_the_face_and_a_photo_without_one_gets_none():
    box, crop, _ = photo_face(photograph(), 64, "box")
    assert near(box, FACE) and crop.shape == (64, 64, 3)
    from skimage import data

    assert photo_face(data.coffee(), 64, "box") is None


def test_the_face_in_more_frames_wins_over_a_larger_one_seen_less():
    large = (100, 100, 220, 220)  # 120 px, in 2 of 8 frames
    small = (300, 100, 360, 160)  # 60 px, in every frame
    boxes = [[small, large] if i in (3, 4) else [small] for i in range(8)]
    assert main_track(boxes) == [small] * 8
    equal_frames = [[small, large]] * 8
    assert main_track(equal_frames) == [large] * 8  # same frames, same confidence: the larger face
    sure = [[0.2, 1.5]] * 8
    assert main_track(equal_frames, [[2.0, 0.1]] * 8) == [small] * 8  # the larger one barely found
    assert main_track(equal_frames, sure) == [large] * 8


def test_the_landmarks_of_the_face_hold_and_those_of_the_patch_drift():
    """With the landmarks extra: dlib's 68 points stay on the astronaut's features when her box is
    nudged, and follow the box on the mission patch (a pattern with no face's features)."""
    from triskele.train.domains.deepfake.landmarks import INSTALL, landmark_predictor

    if landmark_predictor() is None:
        pytest.skip(f"the landmarks extra: {INSTALL}")
    photo = photograph()
    assert landmarks_hold(photo, FACE) is True
    assert landmarks_hold(photo, (126, 335, 215, 425)) is False  # dlib's box on the patch (upsampled once)


def test_a_track_whose_landmarks_fit_a_face_wins_over_a_heavier_one_that_does_not():
    face, pattern = (100, 100, 160, 160), (300, 100, 420, 220)
    boxes, scores = [[face, pattern]] * 4, [[0.3, 2.0]] * 4
    assert main_track(boxes, scores) == [pattern] * 4
    assert main_track(boxes, scores, [[True, False]] * 4) == [face] * 4
    assert main_track(boxes, scores, [[None, None]] * 4) == [pattern] * 4  # not known: the weight decides
