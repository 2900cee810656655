"""Face landmarks: a synthetic face's drawn landmarks, the 5-point alignment, the
hull mask, `prepare` storing dlib's 68 points beside the crops, and the fallback without the extra."""

import json
import logging
import sys

import numpy as np
import pytest
from scipy import ndimage
from triskele.train.domains.deepfake import landmarks as lm
from triskele.train.domains.deepfake.align import (
    ALIGNMENT_POINTS,
    aligned_crop,
    alignment_template,
    apply_transform,
    similarity_transform,
)
from triskele.train.domains.deepfake.data import FaceFrames, SyntheticFaces, _identity, render_face
from triskele.train.domains.deepfake.drawn_landmarks import drawn_landmarks
from triskele.train.domains.deepfake.landmarks import hull_region, landmarks_file
from videoutil import FACE_POINTS, pan, pan_offsets, write_video

needs_extra = pytest.mark.skipif(lm.predictor_path() is None, reason=f"needs the landmarks extra: {lm.INSTALL}")


@pytest.fixture
def fresh_landmarks(monkeypatch):
    """A process that has loaded no predictor and said nothing yet."""
    monkeypatch.setattr(lm, "_LOCAL", type(lm._LOCAL)())
    monkeypatch.setattr(lm, "_SAID", set())


def test_drawn_landmarks_lie_on_the_features_the_face_is_drawn_with():
    for identity in range(12):
        ident, shift = _identity(0, identity), (1.3, -2.1)
        image, _, face = render_face(ident, 256, shift)
        points = drawn_landmarks(ident, 256, shift)
        colour = [image[int(round(y)), int(round(x))] for x, y in points]
        eyes = [np.allclose(c, 0.92) or np.allclose(c, ident["iris"]) for c in colour[36:48]]
        assert all(eyes) and all(np.allclose(c, ident["lips"]) for c in colour[48:68])
        assert all(np.allclose(c, ident["hair"]) for c in colour[17:27])  # the brows are drawn in the hair's colour
        rows, cols = np.nonzero((face > 0) & ~ndimage.binary_erosion(face > 0))  # the oval's edge pixels
        jaw_gap = [np.hypot(cols - x, rows - y).min() for x, y in points[:17]]
        assert max(jaw_gap) < 1.5 and points[8, 1] == points[:, 1].max()  # on the oval; the chin lowest
        left, right = points[36:42, 0].mean(), points[42:48, 0].mean()
        assert left < points[27:36, 0].min() and points[27:36, 0].max() < right  # the nose between the eyes
        assert points[36, 0] < points[39, 0] < points[42, 0] < points[45, 0] and points[48, 0] < points[54, 0]
        assert points[37, 1] < points[41, 1] and points[51, 1] < points[57, 1]  # upper lid and lip above lower


def test_the_hull_covers_the_landmarks_and_stays_inside_the_face():
    square = hull_region(np.array([[2.0, 3.0], [6.0, 3.0], [6.0, 5.0], [2.0, 5.0], [4.0, 4.0]]), 10)
    assert square.sum() == 5 * 3 and square[3:6, 2:7].all()  # pixel centres x 2..6, y 3..5, edges included
    ident = _identity(0, 3)
    _, _, face = render_face(ident, 64)
    points = drawn_landmarks(ident, 64)
    hull = hull_region(points, 64)
    assert not (hull > face).any() and 0.5 < hull.sum() / face.sum() < 0.95  # the oval less the forehead
    rows, cols = np.nonzero(hull)
    assert max(np.hypot(cols - x, rows - y).min() for x, y in points) <= np.sqrt(2)  # within a pixel's diagonal
    with pytest.raises(ValueError, match="span no area"):
        hull_region(np.zeros((68, 2)), 8)


def test_synthetic_sbi_keeps_the_drawn_oval_unless_the_hull_is_asked_for():
    oval = SyntheticFaces("train", 8, 64, 4).real_face(0)[1]
    hull = SyntheticFaces("train", 8, 64, 4, sbi_mask="hull").real_face(0)[1]
    assert oval.sum() > hull.sum() > 0 and not (hull > oval).any()
    np.testing.assert_array_equal(SyntheticFaces("train", 8, 64, 4, sbi_mask="ellipse").real_face(0)[1], oval)
    with pytest.raises(ValueError, match="deepfake.sbi_mask.*choose one of auto, ellipse, hull"):
        SyntheticFaces("train", 8, 64, 4, sbi_mask="convex")


def test_the_5_point_alignment_is_deepfakebenchs_and_maps_the_points_onto_its_template():
    from skimage.transform import SimilarityTransform

    dst = np.array([[30.2946, 51.6963], [65.5318, 51.5014], [48.0252, 71.7366], [33.5493, 92.3655],
                    [62.7299, 92.2041]])  # DeepfakeBench's img_align_crop, step by step, for 256 px at 1.3x
    dst[:, 0] += 8.0
    dst = dst * 256 / 112 + 256 * 0.3 / 2
    dst *= 256 / (256 + 256 * 0.3)
    np.testing.assert_allclose(alignment_template(256, 1.3), dst, atol=1e-9)
    rng = np.random.default_rng(0)
    source = rng.uniform(0, 300, (5, 2))
    if hasattr(SimilarityTransform, "from_estimate"):  # scikit-image 0.26 on
        reference = SimilarityTransform.from_estimate(source, dst)
    else:
        reference = SimilarityTransform()
        reference.estimate(source, dst)
    np.testing.assert_allclose(similarity_transform(source, dst), reference.params[:2], atol=1e-9)
    angle, scale = np.deg2rad(17), 1.8  # a face turned and larger in the frame: exactly similar to the template
    into_frame = np.array([[scale * np.cos(angle), -scale * np.sin(angle), 40.0],
                           [scale * np.sin(angle), scale * np.cos(angle), 25.0]])
    points = rng.uniform(0, 256, (68, 2))
    points[list(ALIGNMENT_POINTS)] = apply_transform(into_frame, dst)
    frame = np.zeros((600, 600, 3), np.uint8)
    for x, y in points[list(ALIGNMENT_POINTS)]:
        frame[int(round(y)) - 1:int(round(y)) + 2, int(round(x)) - 1:int(round(x)) + 2] = 255
    crop, moved = aligned_crop(frame, points, 256, 1.3)
    np.testing.assert_allclose(moved[list(ALIGNMENT_POINTS)], dst, atol=1e-3)
    for x, y in dst:  # the dots drawn in the frame land on the template in the crop's pixels
        top, left = int(y) - 3, int(x) - 3
        window = crop[top:top + 8, left:left + 8, 0].astype(float)
        r, c = np.unravel_index(window.argmax(), window.shape)
        assert np.hypot(left + c - x, top + r - y) <= 1.0, (x, y, left + c, top + r)


def test_landmarks_lie_beside_the_frames_as_deepfakebench_keeps_them(tmp_path):
    ffpp = tmp_path / "original_sequences/youtube/c23/frames/000/000012.png"
    assert landmarks_file(ffpp, tmp_path) == tmp_path / "original_sequences/youtube/c23/landmarks/000/000012.npy"
    assert landmarks_file(tmp_path / "Celeb-real/id0/000003.png", tmp_path) == (
        tmp_path / "landmarks/Celeb-real/id0/000003.npy")


@needs_extra
def test_dlibs_68_points_on_a_test_videos_face_lie_on_the_photographs_features(tmp_path, fresh_landmarks):
    from triskele.train.domains.deepfake.faces import detect_faces
    from triskele.train.domains.deepfake.video import sample_frames

    sampled = sample_frames(write_video(tmp_path / "pan.mp4", pan(12)), 3)
    indices, frames = sampled.indices, sampled.frames
    for index, frame in zip(indices, frames, strict=True):
        points = lm.face_landmarks(frame, detect_faces(frame)[0])
        found = {"left eye": points[36:42].mean(0), "right eye": points[42:48].mean(0), "nose tip": points[30],
                 "mouth left": points[48], "mouth right": points[54], "chin": points[8]}
        left, top = pan_offsets(12)[index]
        for name, (x, y) in FACE_POINTS.items():
            assert np.hypot(*(found[name] - (x - left, y - top))) < 4, (index, name, found[name], x - left, y - top)


def _generic_tree(root):
    write_video(root / "real" / "000.mp4", pan(6))
    write_video(root / "fake" / "001.mp4", pan(6, shift=(30, -20, 10)))
    return root


@needs_extra
def test_prepare_stores_dlibs_68_landmarks_on_the_face_and_sbi_masks_their_hull(tmp_path, fresh_landmarks):
    from triskele.train.domains.deepfake.faces import detect_faces
    from triskele.train.domains.deepfake.prepare import prepare_deepfake

    out = tmp_path / "out"
    summary = prepare_deepfake(_generic_tree(tmp_path / "raw"), out, frames=3, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert summary["crops"].startswith("aligned") and manifest["landmarks"]
    assert [v["landmarks_written"] for v in manifest["videos"]] == [3, 3]
    assert manifest["crops"] == "aligned" and [v["crops"] for v in manifest["videos"]] == ["aligned"] * 2
    with pytest.raises(ValueError, match=r"holds videos prepared with aligned face crops; this run would add box ones"
                                         r".*give --crops aligned to finish it, or a new --output"):
        prepare_deepfake(tmp_path / "raw", out, frames=3, progress=False, crops="box")  # one tree, one kind of crop
    crops = sorted((out / "real" / "000").glob("*.png")) + sorted((out / "fake" / "001").glob("*.png"))
    assert len(crops) == 6
    from PIL import Image

    for crop in crops:
        points = np.load(landmarks_file(crop, out))
        assert points.shape == (68, 2)
        left, top, right, bottom = detect_faces(np.asarray(Image.open(crop)))[0]  # the face found in the crop
        margin = 0.1 * (right - left)
        assert (points[:, 0] > left - margin).all() and (points[:, 0] < right + margin).all()
        assert (points[:, 1] > top - margin).all() and (points[:, 1] < bottom + margin).all()
        best = similarity_transform(points[list(ALIGNMENT_POINTS)], alignment_template(256, 1.3))
        np.testing.assert_allclose(best, [[1, 0, 0], [0, 1, 0]], atol=1e-3)  # aligned: already the best fit
    frames = FaceFrames(out, "train", 64, 3, reals_only=True)
    image, region, _ = frames.real_face(0)
    points = (np.load(landmarks_file(frames.records[frames._reals[0]][0][0], out)) + 0.5) * 64 / 256 - 0.5
    np.testing.assert_array_equal(region, hull_region(points, 64))
    assert region.shape == image.shape[:2] and 0 < region.mean() < 0.8 and region[0].sum() == region[:, 0].sum() == 0


@needs_extra
def test_a_damaged_or_missing_model_file_is_an_error_naming_it_and_the_fix(tmp_path, monkeypatch, fresh_landmarks):
    broken = tmp_path / lm.PREDICTOR_FILE
    broken.write_bytes(b"not a shape predictor")
    monkeypatch.setattr(lm, "predictor_path", lambda: broken)
    with pytest.raises(ValueError, match=rf"{broken}.*cannot be read.*pip install -e '\.\[landmarks\]'"):
        lm.landmark_predictor()
    monkeypatch.setattr(lm, "predictor_path", lambda: tmp_path / "gone.dat")
    with pytest.raises(ValueError, match=r"gone\.dat is missing.*pip install -e '\.\[landmarks\]'"):
        lm.landmark_predictor()


def test_without_the_extra_faces_are_box_crops_and_it_says_so_once(tmp_path, monkeypatch, caplog, fresh_landmarks):
    from triskele.train.domains.deepfake.faces import crop_face, video_faces
    from triskele.train.domains.deepfake.prepare import prepare_deepfake

    monkeypatch.setitem(sys.modules, lm.PACKAGE, None)  # as if face-recognition-models were not installed
    caplog.set_level(logging.INFO, logger="triskele.deepfake")
    faces = video_faces(write_video(tmp_path / "pan.mp4", pan(6)), 6, crops="box")
    assert len(faces.crops) == 6 and faces.landmarks == [None] * 6
    from triskele.train.domains.deepfake.video import sample_frames

    first = sample_frames(tmp_path / "pan.mp4", 6).frames[faces.indices[0]]
    np.testing.assert_array_equal(faces.crops[0], crop_face(first, faces.boxes[0]))
    raw, out = _generic_tree(tmp_path / "raw"), tmp_path / "out"
    with pytest.raises(ValueError, match=r"--crops aligned .*not installed: pip install -e '\.\[landmarks\]'"):
        prepare_deepfake(raw, out, frames=2, progress=False, crops="aligned")
    assert not out.exists()
    summary = prepare_deepfake(raw, out, frames=2, progress=False)
    assert summary["frames_written"] == 4 and not (out / "landmarks").exists() and "no landmarks" in summary["crops"]
    assert json.loads((out / "manifest.json").read_text())["crops"] == "box"
    region = FaceFrames(out, "train", 64, 2, reals_only=True).real_face(0)[1]
    from triskele.train.domains.deepfake.faces import crop_face_region

    np.testing.assert_array_equal(region, crop_face_region(64))
    with pytest.raises(ValueError, match=r"sbi_mask=hull, but the crop .* has no landmarks.*\[landmarks\]"):
        FaceFrames(out, "train", 64, 2, reals_only=True, sbi_mask="hull").real_face(0)
    said = [r.getMessage() for r in caplog.records]
    assert sum(f"{lm.PACKAGE} is not installed" in m for m in said) == 1, said
    assert sum("SBI's mask: the ellipse" in m for m in said) == 1, said
