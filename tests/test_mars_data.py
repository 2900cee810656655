import numpy as np
import pytest
from PIL import Image
from triskele.train.domains.mars.data import SyntheticTerrain, TerrainFiles
from triskele.train.domains.mars.metrics import confusion_metrics


def test_synthetic_terrain_is_deterministic_and_splits_differ():
    a, b = SyntheticTerrain("train", 10, 64, seed=0), SyntheticTerrain("train", 10, 64, seed=0)
    for i in range(3):
        np.testing.assert_array_equal(a.load(i)["image"], b.load(i)["image"])
        np.testing.assert_array_equal(a.load(i)["label"], b.load(i)["label"])
    test = SyntheticTerrain("test", 10, 64, seed=0)
    assert not np.array_equal(a.load(0)["image"], test.load(0)["image"])
    assert not np.array_equal(a.load(0)["image"], SyntheticTerrain("train", 10, 64, seed=1).load(0)["image"])
    record = a.load(0)
    assert record["image"].shape == (64, 64, 1) and record["image"].dtype == np.float32
    assert record["label"].shape == (64, 64) and record["label"].dtype == np.uint8


def test_training_crops_are_parts_of_larger_frames():
    frames = SyntheticTerrain("test", 4, 32, frame_size=48)
    crops = SyntheticTerrain("test", 4, 32, frame_size=48, crops=True)
    frame, record = frames.load(1), crops.load(1, np.random.default_rng(7))
    assert frame["image"].shape == (48, 48, 1) and record["image"].shape == (32, 32, 1)
    found = [(t, left) for t in range(17) for left in range(17)
             if np.array_equal(frame["label"][t:t + 32, left:left + 32], record["label"])
             or np.array_equal(frame["label"][t:t + 32, left:left + 32][:, ::-1], record["label"])]
    assert found, "a training crop is a window of the whole frame"
    centre = crops.load(1)
    np.testing.assert_array_equal(centre["image"], frame["image"][8:40, 8:40])


def test_flip_augmentation_depends_on_the_rng_only():
    source = SyntheticTerrain("train", 4, 32)
    plain = source.load(0)
    flips = [source.load(0, np.random.default_rng(s)) for s in range(8)]
    flipped = [np.array_equal(f["image"], plain["image"][:, ::-1]) for f in flips]
    assert any(flipped) and not all(flipped)


def test_class_frequencies_are_near_ai4mars():
    labels = np.stack([SyntheticTerrain("train", 300, 64).load(i)["label"] for i in range(300)])
    labelled = labels[labels != 255]
    share = [(labelled == c).mean() for c in range(4)]
    assert 0.44 < share[1] < 0.56, share  # bedrock ~50%
    assert 0.31 < share[0] < 0.43, share  # soil ~37%
    assert 0.08 < share[2] < 0.16, share  # sand ~12%
    assert 0.004 < share[3] < 0.025, share  # big rock ~1%
    assert 0.1 < (labels == 255).mean() < 0.5  # sky and far range are ignored


def _intensity_classifier_miou(train, test, bins=64):
    """The best per-pixel classifier from intensity alone: majority class of each intensity bin."""
    def pixels(source, n):
        records = [source.load(i) for i in range(n)]
        x = np.concatenate([r["image"][..., 0].ravel() for r in records])
        y = np.concatenate([r["label"].ravel() for r in records])
        keep = y != 255
        return np.minimum((x[keep] * bins).astype(int), bins - 1), y[keep]

    xb, yb = pixels(train, 200)
    counts = np.zeros((bins, 4))
    np.add.at(counts, (xb, yb), 1)
    decision = counts.argmax(axis=1)
    xt, yt = pixels(test, 100)
    confusion = np.zeros((4, 4))
    np.add.at(confusion, (yt, decision[xt]), 1)
    return confusion_metrics(confusion)["miou"]


def test_intensity_alone_cannot_solve_the_task():
    miou = _intensity_classifier_miou(SyntheticTerrain("train", 200, 64), SyntheticTerrain("test", 100, 64))
    assert miou < 0.35, miou


def test_metrics_on_hand_made_confusion_matrices():
    perfect = confusion_metrics(np.diag([10, 20, 30, 40]))
    assert perfect["pixel_acc"] == 1 and perfect["miou"] == 1
    confusion = np.array([[8, 2, 0, 0], [1, 9, 0, 0], [0, 0, 3, 1], [0, 0, 1, 0]])
    m = confusion_metrics(confusion)
    assert m["pixel_acc"] == pytest.approx(20 / 25)
    assert m["iou"] == pytest.approx({"soil": 8 / 11, "bedrock": 9 / 12, "sand": 3 / 5, "big_rock": 0.0})
    assert m["miou"] == pytest.approx((8 / 11 + 9 / 12 + 3 / 5 + 0) / 4)
    assert m["recall"] == pytest.approx({"soil": 0.8, "bedrock": 0.9, "sand": 0.75, "big_rock": 0.0})
    # A class absent from truth and prediction has no IoU and is left out of the mean.
    absent = confusion_metrics(np.array([[5, 1, 0, 0], [1, 5, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))
    assert np.isnan(absent["iou"]["sand"]) and absent["miou"] == pytest.approx(5 / 7)


# --- AI4Mars layout on a tiny tree -----------------------------------------------------------

STEMS = ["NLA_1000EDR_F01", "NLA_1001EDR_F02", "NLA_1002EDR_F03"]


def _save(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(array, np.uint8)).save(path)


def write_ai4mars(root, size=48):
    rng = np.random.default_rng(0)
    msl = root / "msl"
    for stem in STEMS:
        _save(msl / "images" / "edr" / f"{stem}.JPG", rng.integers(0, 255, (size, size)))
        rover = np.zeros((size, size))
        rover[-6:] = 1
        far = np.zeros((size, size))
        far[:5] = 1
        _save(msl / "images" / "mxy" / f"{stem.replace('EDR', 'MXY')}.png", rover)
        _save(msl / "images" / "rng-30m" / f"{stem.replace('EDR', 'RNG')}.png", far)
    label = np.tile(np.array([0, 1, 2, 3], np.uint8).repeat(size // 4), (size, 1))
    for stem in STEMS[:2]:  # the third image has no label: counted, not an error
        _save(msl / "labels" / "train" / f"{stem}.png", label)
    _save(msl / "labels" / "test" / "masked-gold-min3-100agree" / f"{STEMS[2]}_merged.png", label)
    return label


def test_ai4mars_loader_masks_rover_and_range_and_counts_unlabelled(tmp_path):
    write_ai4mars(tmp_path)
    train = TerrainFiles(tmp_path, "train", 48)
    assert len(train) == 2 and train.unlabelled == 1
    assert "2 labelled images, 1 images without a label skipped" in train.report()
    record = train.load(0)
    assert record["image"].shape == (48, 48, 1)
    assert (record["label"][-6:] == 255).all() and (record["label"][:5] == 255).all()
    middle = record["label"][10:40]
    assert set(np.unique(middle)) == {0, 1, 2, 3}
    test = TerrainFiles(tmp_path, "test", 24)  # evaluation: the whole frame, its label at native resolution
    assert len(test) == 1 and test.load(0)["label"].shape == (48, 48) and test.load(0)["image"].shape == (48, 48, 1)
    halved = TerrainFiles(tmp_path, "test", 24, scale=0.5)
    assert halved.load(0)["image"].shape == (24, 24, 1) and halved.load(0)["label"].shape == (48, 48)
    crops = TerrainFiles(tmp_path, "train", 16, scale=0.5, crops=True)
    record = crops.load(0, np.random.default_rng(0))
    assert record["image"].shape == (16, 16, 1) and record["label"].shape == (16, 16)


def test_ai4mars_bad_inputs_name_the_file(tmp_path):
    write_ai4mars(tmp_path)
    labels = tmp_path / "msl" / "labels" / "train"
    _save(labels / "NLA_9999EDR_F09.png", np.zeros((48, 48)))
    with pytest.raises(ValueError, match="NLA_9999EDR_F09.png has no image"):
        TerrainFiles(tmp_path, "train", 48)
    (labels / "NLA_9999EDR_F09.png").unlink()

    _save(labels / f"{STEMS[0]}.png", np.full((48, 48), 7))
    with pytest.raises(ValueError, match=rf"label .*{STEMS[0]}.png has values \[7\] outside 0..3"):
        TerrainFiles(tmp_path, "train", 48).load(0)

    _save(labels / f"{STEMS[0]}.png", np.zeros((40, 48)))
    with pytest.raises(ValueError, match=rf"mask .*{STEMS[0]}.png is 48x40 but its image"):
        TerrainFiles(tmp_path, "train", 48).load(0)

    _save(labels / f"{STEMS[0]}.png", np.zeros((48, 48)))
    (tmp_path / "msl" / "images" / "edr" / f"{STEMS[0]}.JPG").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=rf"cannot read image .*{STEMS[0]}.JPG"):
        TerrainFiles(tmp_path, "train", 48).load(0)


def test_generic_layout_and_layout_errors(tmp_path):
    _save(tmp_path / "images" / "a.png", np.full((30, 40), 100))
    _save(tmp_path / "masks" / "a.png", np.ones((30, 40)))
    _save(tmp_path / "images" / "b.jpg", np.full((30, 40), 50))
    files = TerrainFiles(tmp_path, "train", 16)
    assert len(files) == 1 and files.unlabelled == 1
    assert (files.load(0)["label"] == 1).all()
    with pytest.raises(ValueError, match="matches no Mars layout"):
        TerrainFiles(tmp_path / "images", "train", 16)
    with pytest.raises(ValueError, match="is not a folder"):
        TerrainFiles(tmp_path / "missing", "train", 16)
