"""Deepfake on real videos: decoding, faces as DeepfakeBench finds them, video prediction, and
`prepare` from a FaceForensics++-style video tree; the videos are made from a photograph that
scikit-image ships."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image
from videoutil import FACE, face_centre, pan, pan_offsets, slide, wall, write_video, zoom

pytest.importorskip("dlib", reason="face detection needs dlib (pip install dlib-bin)")
pytest.importorskip("cv2", reason="video decoding needs OpenCV (pip install 'opencv-python-headless<5')")
pytest.importorskip("skimage", reason="the test videos need scikit-image's sample photograph")

from triskele.eval.cli import main as eval_main  # noqa: E402
from triskele.train.cli import main as train_main  # noqa: E402
from triskele.train.domains.deepfake.data import FaceFrames  # noqa: E402
from triskele.train.domains.deepfake.faces import crop_face, link_cost, main_track, video_faces  # noqa: E402
from triskele.train.domains.deepfake.video import count_frames, sample_frames  # noqa: E402

pytestmark = pytest.mark.xdist_group("videos")  # one prepared tree and run shared by the module


def test_a_pan_over_a_photograph_finds_the_face_in_nearly_every_frame(tmp_path):
    path = write_video(tmp_path / "pan.mp4", pan(40))
    assert count_frames(path) == 40
    faces = video_faces(path, 32, crops="box")
    assert faces.frames_sampled == 32 and len(faces.crops) >= 30, faces.left_out
    width = FACE[2] - FACE[0]
    offsets = pan_offsets(40)
    for index, box in zip(faces.indices, faces.boxes, strict=True):
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        known = face_centre(offsets[index])
        assert abs(cx - known[0]) < 0.1 * width and abs(cy - known[1]) < 0.1 * width, (index, box, known)
    assert all(c.shape == (256, 256, 3) and c.dtype == np.uint8 for c in faces.crops)


def test_the_zoom_keeps_the_face_and_covered_frames_are_counted_out(tmp_path):
    zoomed = video_faces(write_video(tmp_path / "zoom.mp4", zoom(24)), 24, crops="box")
    assert len(zoomed.crops) >= 22, zoomed.left_out
    covered = video_faces(write_video(tmp_path / "covered.mp4", pan(40, covered=range(10, 20))), 40, crops="box")
    assert set(range(10, 20)) <= set(covered.left_out) and all(covered.left_out[i] == "no face"
                                                                for i in range(10, 20))
    assert len(covered.crops) >= 28


def test_a_passer_by_does_not_switch_the_identity(tmp_path):
    faces = video_faces(write_video(tmp_path / "crowd.mp4", pan(30, second_face=range(5, 25))), 30, crops="box")
    offsets = pan_offsets(30)
    for index, box in zip(faces.indices, faces.boxes, strict=True):
        known = face_centre(offsets[index])
        assert abs((box[0] + box[2]) / 2 - known[0]) < 20, (index, box)


def test_a_face_moving_most_of_its_width_between_samples_keeps_every_sampled_frame(tmp_path):
    """8 samples of a 40-frame 854x480 pan at 9 px a frame (the face, 87 px wide, moves
    about 50 px between samples: IoU 0.29) gave one face of 8 when tracks were linked by IoU."""
    faces = video_faces(write_video(tmp_path / "slide.mp4", slide(40, 9)), 8, crops="box")
    assert faces.frames_sampled == 8 and len(faces.crops) == 8, faces.left_out
    for index, box in zip(faces.indices, faces.boxes, strict=True):
        known = face_centre((-9 * index, 0))
        assert abs((box[0] + box[2]) / 2 - known[0]) < 10 and abs((box[1] + box[3]) / 2 - known[1]) < 10, (index, box)


def test_tracks_link_by_motion_for_the_face_size_and_a_passer_by_never_takes_over():
    face = [(100 + 60 * i, 100, 200 + 60 * i, 200) for i in range(6)]  # 0.6 of its width per sample
    passer = (400, 380, 460, 440)  # beside the face in frames 1-4, on its own in frame 5
    boxes = [[face[0]], [face[1], passer], [face[2], passer], [passer], [face[4], passer], [passer]]
    assert main_track(boxes) == [face[0], face[1], face[2], None, face[4], None]
    jumped = (900, 100, 1000, 200)  # far beyond reach, but the only face and no other track competes
    assert main_track([[face[0]], [face[1]], [jumped], [face[3]]]) == [face[0], face[1], jumped, face[3]]
    assert main_track([[face[0]], [], [face[2]]]) == [face[0], None, face[2]]  # two samples apart: in reach
    assert link_cost(face[0], (100, 100, 300, 300), 1) is None  # twice the size: another face
    assert link_cost(face[0], face[1], 1) == pytest.approx(0.6) and link_cost(face[0], face[2], 1) is None


def test_tracking_and_cropping_on_hand_made_boxes():
    big, small = (100, 100, 200, 200), (10, 10, 40, 40)
    boxes = [[big], [small, (102, 101, 203, 199)], [small], [(104, 100, 205, 201)]]
    assert main_track(boxes) == [big, (102, 101, 203, 199), None, (104, 100, 205, 201)]
    frame = np.zeros((120, 160, 3), np.uint8)
    frame[40:80, 60:100] = 255
    crop = crop_face(frame, (60, 40, 100, 80), 26)  # 1.3 x 40 = 52 px square about (80, 60), resized
    assert crop.shape == (26, 26, 3) and crop[13, 13].tolist() == [255, 255, 255] and crop[0, 0].tolist() == [0, 0, 0]


def test_unreadable_videos_are_errors_naming_the_file(tmp_path):
    good = write_video(tmp_path / "good.mp4", pan(10))
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "cut.mp4").write_bytes(good.read_bytes()[:300])
    for name in ("empty.mp4", "cut.mp4"):
        with pytest.raises(ValueError, match=rf"cannot read video .*{name}"):
            sample_frames(tmp_path / name, 4)


def test_the_video_backends_write_nothing_to_stderr_for_a_damaged_video(tmp_path):
    """FFmpeg and OpenCV printed their own lines (raw bytes, not always UTF-8) to
    stderr; the error naming the file is all a reader gets, stderr stays text."""
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(write_video(tmp_path / "good.mp4", pan(10)).read_bytes()[:300])
    code = ("import sys; from pathlib import Path; from triskele.train.domains.deepfake.video import sample_frames\n"
            "try: sample_frames(Path(sys.argv[1]), 4)\nexcept ValueError as err: print(err)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCV_")}
    done = subprocess.run([sys.executable, "-c", code, str(cut)], capture_output=True, timeout=120, env=env)
    assert done.stdout.decode().startswith(f"cannot read video {cut}") and done.stderr == b"", done.stderr[-2000:]


# --- prepare, train, predict ----------------------------------------------------------------------

def _ffpp_videos(root):
    real = root / "original_sequences" / "youtube" / "c23" / "videos"
    fake = root / "manipulated_sequences" / "Deepfakes" / "c23" / "videos"
    for i, vid in enumerate(("000", "001", "002", "003")):
        write_video(real / f"{vid}.mp4", pan(16, shift=(i * 3, 0, 0)))
    for i, vid in enumerate(("000_001", "001_000", "002_003", "003_002")):
        write_video(fake / f"{vid}.mp4", pan(16, shift=(40, -30, 10 + i)))
    (root / "splits").mkdir(parents=True)
    (root / "splits" / "train.json").write_text(json.dumps([["000", "001"], ["002", "003"]]))
    (root / "splits" / "test.json").write_text(json.dumps([["002", "003"]]))
    return root


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    raw = _ffpp_videos(tmp_path_factory.mktemp("raw"))
    out = tmp_path_factory.mktemp("prepared")
    assert train_main(["prepare", "deepfake", "--input", str(raw), "--output", str(out), "--frames", "8",
                       "--workers", "2", "--no-progress"]) == 0
    return raw, out


def test_prepare_writes_the_layout_the_loader_reads_and_a_rerun_skips(prepared, capsys):
    raw, out = prepared
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["videos"]) == 8
    for entry in manifest["videos"]:
        assert entry["frames_sampled"] == 8 and entry["frames_written"] >= 7, entry
    files = FaceFrames(out, "train", 32, frames_per_video=8)
    assert files.layout == "FaceForensics++" and len(files.video_names) == 8
    assert files.load(0)["image"].shape == (32, 32, 3)
    assert (out / "splits" / "test.json").is_file()
    capsys.readouterr()
    assert train_main(["prepare", "deepfake", "--input", str(raw), "--output", str(out), "--frames", "8",
                       "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped"] == 8 and summary["prepared"] == 0


def test_prepare_lists_each_failed_video_and_its_reason_on_stderr(prepared, tmp_path, capsys):
    raw, out = prepared
    shutil.copytree(raw, tmp_path / "raw")
    shutil.copytree(out, tmp_path / "out")  # the eight good videos are done: this run reads only the broken two
    videos = tmp_path / "raw" / "original_sequences" / "youtube" / "c23" / "videos"
    (videos / "empty.mp4").write_bytes(b"")
    (videos / "cut.mp4").write_bytes((videos / "000.mp4").read_bytes()[:300])
    assert train_main(["prepare", "deepfake", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "out"),
                       "--frames", "8", "--no-progress"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("2 of 10 videos failed")
    for name, line in zip(("cut.mp4", "empty.mp4"), err[1:], strict=True):
        assert line.startswith(f"  original_sequences/youtube/c23/videos/{name}: cannot read video "), line


def test_ctrl_c_during_prepare_keeps_the_videos_done_and_the_rerun_prepares_the_rest(prepared, tmp_path):
    raw, _ = prepared
    out = tmp_path / "out"
    command = [sys.executable, "-m", "triskele.train", "prepare", "deepfake", "--input", str(raw), "--output",
               str(out), "--frames", "8", "--no-progress"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = out / ".prepare"
    deadline = time.monotonic() + 240
    while not (records.is_dir() and any(records.rglob("*.json"))):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "prepare: Ctrl-C: finishing the video in hand" in stderr, stderr[-3000:]
    summary = json.loads(stdout)
    assert summary["interrupted"] is True and 0 < summary["prepared"] < 8, summary
    assert len(json.loads((out / "manifest.json").read_text())["videos"]) == summary["prepared"]
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    again = json.loads(rerun.stdout)
    assert (again["skipped"], again["prepared"], again["interrupted"]) == (summary["prepared"],
                                                                            8 - summary["prepared"], False)


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    _, out = prepared
    workdir = tmp_path_factory.mktemp("run")
    assert train_main(["--preset", "deepfake-tiny", "--workdir", str(workdir), "--data", str(out), "--steps", "20",
                       "--no-progress", "--set", "model.image_size=32", "--set", "data.global_batch=8",
                       "--set", "deepfake.frames_per_video=8", "--set", "run.eval_every=0",
                       "--set", "optim.warmup_steps=0"]) == 0
    return workdir


def test_predict_on_videos_scores_faces_lists_the_rest_and_equals_the_prepared_crops(prepared, trained, tmp_path):
    raw, out = prepared
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(raw / "original_sequences" / "youtube" / "c23" / "videos" / "002.mp4", inputs / "002.mp4")
    write_video(inputs / "wall.mp4", wall(12))
    (inputs / "empty.mp4").write_bytes(b"")
    (inputs / "cut.mp4").write_bytes((inputs / "002.mp4").read_bytes()[:400])
    result = tmp_path / "out"
    assert eval_main(["predict", "--workdir", str(trained), "--input", str(inputs), "--output", str(result),
                      "--save-faces", str(tmp_path / "faces"), "--frames-per-video", "8", "--no-progress"]) == 1
    videos = {r["video"]: r for r in csv.DictReader((result / "videos.csv").open())}
    assert set(videos) == {"002.mp4", "wall.mp4"}
    assert videos["002.mp4"]["frames_sampled"] == "8" and int(videos["002.mp4"]["faces_found"]) >= 7
    assert 0 <= float(videos["002.mp4"]["fake_probability"]) <= 1 and videos["002.mp4"]["reason"] == ""
    assert videos["wall.mp4"]["fake_probability"] == "" and videos["wall.mp4"]["reason"].startswith("no face")
    errors = {r["input"]: r["reason"] for r in csv.DictReader((result / "errors.csv").open())}
    assert set(errors) == {"empty.mp4", "cut.mp4"} and all("cannot read video" in r for r in errors.values())
    frames = [r for r in csv.DictReader((result / "frames.csv").open()) if r["video"] == "002.mp4"]
    assert len(frames) == int(videos["002.mp4"]["faces_found"]) and all(len(r["box"].split()) == 4 for r in frames)
    assert len(list((tmp_path / "faces" / "002.mp4").glob("*.png"))) == len(frames)

    crops = out / "original_sequences" / "youtube" / "c23" / "frames" / "002"
    assert eval_main(["predict", "--workdir", str(trained), "--input", str(crops), "--output",
                      str(tmp_path / "crops"), "--frames-per-video", "8", "--no-progress"]) == 0
    from_crops = list(csv.DictReader((tmp_path / "crops" / "frames.csv").open()))
    assert [r["frame"] for r in from_crops] == [f"{r['frame']}.png" for r in frames]
    np.testing.assert_allclose([float(r["fake_probability"]) for r in from_crops],
                               [float(r["fake_probability"]) for r in frames], atol=1e-6)
    saved = np.asarray(Image.open(tmp_path / "faces" / "002.mp4" / f"{frames[0]['frame']}.png"))
    np.testing.assert_array_equal(saved, np.asarray(Image.open(crops / f"{frames[0]['frame']}.png")))
