import json

import numpy as np
import pytest
from PIL import Image
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from triskele.train.domains.deepfake.data import FAMILIES, FaceFrames, SyntheticFaces, sample_uniformly


def test_synthetic_faces_are_deterministic_paired_and_labelled():
    a = SyntheticFaces("train", 32, 32, frames_per_video=4)
    b = SyntheticFaces("train", 32, 32, frames_per_video=4)
    assert len(a) == 32 and a.num_videos == 8
    for i in (0, 5, 31):
        np.testing.assert_array_equal(a.load(i)["image"], b.load(i)["image"])
    records = [a.load(i) for i in range(len(a))]
    assert [int(r["label"]) for r in records[::4]] == [0, 1] * 4  # video v is fake when v is odd
    assert [int(r["video"]) for r in records[:8]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert records[0]["image"].shape == (32, 32, 3)
    # Frames of one video move a little; the test split is other faces.
    assert 0 < np.abs(records[0]["image"] - records[3]["image"]).mean() < 0.1
    test = SyntheticFaces("test", 32, 32, frames_per_video=4)
    assert not np.array_equal(test.load(0)["image"], records[0]["image"])


def test_families_and_holdout():
    faces = SyntheticFaces("train", 400, 16, frames_per_video=1)
    seen = {faces.family(v) for v in range(1, faces.num_videos, 2)}
    assert seen == set(FAMILIES)
    without = SyntheticFaces("train", 400, 16, frames_per_video=1, families=("ColorShift", "Exposure", "Resample"))
    assert {without.family(v) for v in range(1, 400, 2)} == {"ColorShift", "Exposure", "Resample"}
    with pytest.raises(ValueError, match="unknown"):
        SyntheticFaces("train", 10, 16, 1, families=("FaceSwap",))


def test_clips_for_the_video_model():
    clips = SyntheticFaces("train", 6, 24, frames_per_video=8, clip_frames=4)
    assert len(clips) == 6 and clips.load(1)["image"].shape == (4, 24, 24, 3)
    assert int(clips.load(1)["label"]) == 1 and int(clips.load(1)["video"]) == 1


def _global_features(source, n):
    rows, labels = [], []
    for i in range(n):
        record = source.load(i)
        image = record["image"]
        hist = [np.histogram(image[..., c], bins=16, range=(0, 1))[0] / image[..., c].size for c in range(3)]
        rows.append(np.concatenate([image.mean((0, 1)), image.std((0, 1)), *hist]))
        labels.append(int(record["label"]))
    return np.array(rows), np.array(labels)


def test_global_image_statistics_cannot_solve_the_task():
    x_train, y_train = _global_features(SyntheticFaces("train", 1200, 48, frames_per_video=2), 1200)
    x_test, y_test = _global_features(SyntheticFaces("test", 600, 48, frames_per_video=2), 600)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x_train, y_train)
    auc = roc_auc_score(y_test, model.predict_proba(x_test)[:, 1])
    assert auc < 0.70, auc


def test_uniform_frame_sampling():
    frames = [f"{i:03d}" for i in range(100)]
    assert sample_uniformly(frames, 5) == ["000", "025", "050", "074", "099"]
    assert sample_uniformly(frames[:3], 5) == frames[:3]


# --- FaceForensics++ frames layout on a tiny tree ----------------------------------------------


def _frames(folder, count, value=128):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(np.full((20, 20, 3), value + i, np.uint8)).save(folder / f"{i:03d}.png")


def write_ffpp(root, with_splits=True):
    real = root / "original_sequences" / "youtube" / "c23" / "frames"
    for vid in ("000", "001", "002", "003"):
        _frames(real / vid, 6)
    for method in ("Deepfakes", "FaceSwap"):
        fake = root / "manipulated_sequences" / method / "c23" / "frames"
        for vid in ("000_001", "001_000", "002_003", "003_002"):
            _frames(fake / vid, 5, value=30)
    if with_splits:
        (root / "splits").mkdir()
        (root / "splits" / "train.json").write_text(json.dumps([["000", "001"]]))
        (root / "splits" / "test.json").write_text(json.dumps([["002", "003"]]))


def test_ffpp_layout_with_official_splits(tmp_path):
    write_ffpp(tmp_path)
    train = FaceFrames(tmp_path, "train", 16, frames_per_video=3)
    assert train.layout == "FaceForensics++"
    assert train.video_names == ["original/000", "original/001", "Deepfakes/000_001", "Deepfakes/001_000",
                                 "FaceSwap/000_001", "FaceSwap/001_000"]
    assert len(train) == 6 * 3
    record = train.load(0)
    assert record["image"].shape == (16, 16, 3) and int(record["label"]) == 0
    assert int(train.load(len(train) - 1)["label"]) == 1
    held_out = FaceFrames(tmp_path, "train", 16, 3, exclude=("FaceSwap",))
    assert not any(name.startswith("FaceSwap") for name in held_out.video_names)
    only = FaceFrames(tmp_path, "test", 16, 3, methods=("FaceSwap",))
    assert only.video_names == ["original/002", "original/003", "FaceSwap/002_003", "FaceSwap/003_002"]
    clips = FaceFrames(tmp_path, "test", 16, frames_per_video=4, clip_frames=4)
    assert len(clips) == 6 and clips.load(0)["image"].shape == (4, 16, 16, 3)


def test_ffpp_bad_inputs_name_the_file(tmp_path):
    write_ffpp(tmp_path)
    (tmp_path / "splits" / "val.json").write_text(json.dumps([["000", "009"]]))
    with pytest.raises(ValueError, match="lists real video '009'"):
        FaceFrames(tmp_path, "val", 16, 3)
    (tmp_path / "splits" / "val.json").write_text("{not json")
    for split in ("val", "train"):  # a broken split file is an error whichever split is read
        with pytest.raises(ValueError, match="val.json is not a JSON list"):
            FaceFrames(tmp_path, split, 16, 3)
    (tmp_path / "splits" / "val.json").unlink()
    empty = tmp_path / "original_sequences" / "youtube" / "c23" / "frames" / "001"
    for frame in empty.iterdir():
        frame.unlink()
    with pytest.raises(ValueError, match="001 holds no frames"):
        FaceFrames(tmp_path, "train", 16, 3)
    _frames(empty, 2)
    (empty / "000.png").write_bytes(b"broken")
    files = FaceFrames(tmp_path, "train", 16, 3)
    broken = next(i for i, (paths, _, _) in enumerate(files.records) if paths[0] == empty / "000.png")
    with pytest.raises(ValueError, match="cannot read image .*001/000.png"):
        files.load(broken)
    with pytest.raises(ValueError, match="method 'NeuralTextures' not under"):
        FaceFrames(tmp_path, "train", 16, 3, methods=("NeuralTextures",))


def test_ffpp_without_splits_and_generic_layout(tmp_path):
    write_ffpp(tmp_path / "ffpp", with_splits=False)
    files = FaceFrames(tmp_path / "ffpp", "test", 16, 2)
    assert len(files.video_names) == 12 and "every video is in split 'test'" in files.report()
    generic = tmp_path / "generic"
    _frames(generic / "real" / "a", 3)
    _frames(generic / "fake" / "b", 3)
    files = FaceFrames(generic, "train", 16, 8)
    assert files.video_names == ["real/a", "fake/b"] and len(files) == 6
    with pytest.raises(ValueError, match="matches no deepfake layout"):
        FaceFrames(generic / "real", "train", 16, 8)
    _frames(tmp_path / "onlyreal" / "real" / "a", 2)
    (tmp_path / "onlyreal" / "fake").mkdir()
    with pytest.raises(ValueError, match="needs real and fake videos, found 1 real and 0 fake"):
        FaceFrames(tmp_path / "onlyreal", "train", 16, 8)
