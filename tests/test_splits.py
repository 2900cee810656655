"""Selection on validation: each domain's val split is held out of its training data, the test split
is left as it is, an unknown split is refused naming the valid ones, and training evaluates on val."""

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image
from trainutil import train_small
from triskele.train import make_config
from triskele.train.data.splits import SPLITS, hold_out
from triskele.train.domains import _REGISTRY, get_domain
from triskele.train.domains.deepfake.data import FaceFrames
from triskele.train.domains.mars.data import TerrainFiles
from triskele.train.domains.merch.data import ProductImages


def _image(path, shape=(24, 24), value=100):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full(shape, value, np.uint8)).save(path)


def _paths(records):
    return {str(r[0]) for r in records}


def _assert_held_out(make, total: int):
    """train and val of `make(split)` are disjoint, together the training records, val not empty,
    and the same on a second reading."""
    train, val = make("train"), make("val")
    assert _paths(train.records).isdisjoint(_paths(val.records))
    assert len(train) + len(val) == total and 0 < len(val) < total
    assert _paths(make("val").records) == _paths(val.records)
    return train, val


def test_hold_out_is_a_function_of_the_keys_alone():
    keys = [f"video{i}" for i in range(200)]
    val = hold_out(keys, str, "val", 0.1)
    assert 10 <= len(val) <= 30  # ~20 expected (binomial, sd 4)
    assert set(hold_out(keys[::-1], str, "val", 0.1)) == set(val)  # order does not matter
    assert set(hold_out(keys + ["new"], str, "val", 0.1)) - {"new"} == set(val)  # nor added records
    assert set(hold_out(keys, str, "train", 0.1)) == set(keys) - set(val)
    assert len(hold_out(keys[:20], str, "val", 0.05)) >= 1  # 20 keys can spare one at 5%
    with pytest.warns(UserWarning, match="too few"):  # 3 cannot: val is the training records
        assert hold_out(keys[:3], str, "val", 0.1) == hold_out(keys[:3], str, "train", 0.1) == keys[:3]
    with pytest.raises(ValueError, match="data.val_fraction"):
        hold_out(keys, str, "val", 0.0)


def test_ai4mars_val_is_held_out_of_the_train_labels_and_test_untouched(tmp_path):
    msl = tmp_path / "msl"
    stems = [f"NLB_{i:03d}EDR_F0" for i in range(12)]
    for stem in stems:
        _image(msl / "images" / "edr" / f"{stem}.JPG")
    for stem in stems[:10]:
        _image(msl / "labels" / "train" / f"{stem}.png", value=1)
    for stem in stems[10:]:
        _image(msl / "labels" / "test" / "masked-gold-min3-100agree" / f"{stem}_merged.png", value=2)
    _assert_held_out(lambda split: TerrainFiles(tmp_path, split, 16, val_fraction=0.3), 10)
    test = TerrainFiles(tmp_path, "test", 16, val_fraction=0.3)
    assert sorted(r[0].stem for r in test.records) == stems[10:]
    # Through the domain, with the config's data.val_fraction.
    config = make_config("mars-tiny", {"data.path": str(tmp_path), "mars.scale": 1.0, "data.val_fraction": 0.3})
    val = get_domain("mars").open_split(config, "val")
    assert _paths(val.records) == _paths(TerrainFiles(tmp_path, "val", 16, val_fraction=0.3).records)
    with pytest.raises(ValueError, match="unknown split 'valid'; the splits are train, val, test"):
        get_domain("mars").open_split(config, "valid")


def test_generic_mars_layout_uses_a_val_folder_when_there_is_one(tmp_path):
    for i in range(8):
        _image(tmp_path / "train" / "images" / f"{i}.png")
        _image(tmp_path / "train" / "masks" / f"{i}.png", value=0)
    _assert_held_out(lambda split: TerrainFiles(tmp_path, split, 16, val_fraction=0.3), 8)
    _image(tmp_path / "val" / "images" / "v.png")
    _image(tmp_path / "val" / "masks" / "v.png", value=0)
    assert len(TerrainFiles(tmp_path, "train", 16, val_fraction=0.3)) == 8
    assert [r[0].name for r in TerrainFiles(tmp_path, "val", 16, val_fraction=0.3).records] == ["v.png"]


def test_merch_val_is_held_out_of_train_and_test_untouched(tmp_path):
    for sku in ("cola", "tea", "milk"):
        for i in range(5):
            _image(tmp_path / "train" / sku / f"{i}.jpg", (20, 16))
        _image(tmp_path / "test" / sku / "t.jpg", (20, 16))
    train, val = _assert_held_out(lambda split: ProductImages(tmp_path, split, 16, val_fraction=0.3), 15)
    assert val.classes == train.classes == ["cola", "milk", "tea"]
    assert {int(r[2]) for r in val.records} == {0}  # closed-set records of training classes
    assert {r[0].name for r in ProductImages(tmp_path, "test", 16, val_fraction=0.3).records} == {"t.jpg"}
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        ProductImages(tmp_path, "dev", 16)


def _video(folder, frames=2):
    for i in range(frames):
        _image(folder / f"{i:03d}.png", (20, 20, 3))


def test_ffpp_val_holds_whole_pairs_out_of_train_and_test_untouched(tmp_path):
    real = tmp_path / "original_sequences" / "youtube" / "c23" / "frames"
    fake = tmp_path / "manipulated_sequences" / "Deepfakes" / "c23" / "frames"
    pairs = [[f"{2 * i:03d}", f"{2 * i + 1:03d}"] for i in range(5)]
    for a, b in pairs:
        for folder in (real / a, real / b, fake / f"{a}_{b}", fake / f"{b}_{a}"):
            _video(folder)
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits" / "train.json").write_text(json.dumps(pairs[:4]))
    (tmp_path / "splits" / "test.json").write_text(json.dumps(pairs[4:]))
    make = lambda split: FaceFrames(tmp_path, split, 16, 2, val_fraction=0.3)
    train, val = make("train"), make("val")
    assert set(train.video_names).isdisjoint(val.video_names)
    assert len(train.video_names) + len(val.video_names) == 16 and val.video_names == make("val").video_names
    held = {v.split("/")[1] for v in val.video_names if v.startswith("original/")}
    assert held and all((a in held) == (b in held) for a, b in pairs)  # a pair's reals go together ...
    assert all(set(name.split("/")[1].split("_")) <= held for name in val.video_names)  # ... with its fakes
    assert make("test").video_names == ["original/008", "original/009", "Deepfakes/008_009", "Deepfakes/009_008"]


def test_generic_deepfake_val_keeps_same_named_videos_together(tmp_path):
    for split, names in (("train", [f"v{i}" for i in range(6)]), ("test", ["t"])):
        for kind in ("real", "fake"):
            for name in names:
                _video(tmp_path / split / kind / name)
    train = FaceFrames(tmp_path, "train", 16, 2, val_fraction=0.3)
    val = FaceFrames(tmp_path, "val", 16, 2, val_fraction=0.3)
    assert {n.split("/")[1] for n in train.video_names}.isdisjoint({n.split("/")[1] for n in val.video_names})
    assert len(train.video_names) + len(val.video_names) == 12
    assert FaceFrames(tmp_path, "test", 16, 2, val_fraction=0.3).video_names == ["real/t", "fake/t"]


@pytest.mark.parametrize("name", ["mars", "merch", "deepfake"])
def test_an_unknown_split_is_refused_naming_the_splits(name):
    config = make_config(f"{name}-tiny", {})
    with pytest.raises(ValueError, match=f"{', '.join(SPLITS)}"):
        get_domain(name).open_split(config, "validation")


def test_training_evaluates_and_selects_on_val(tmp_path, monkeypatch):
    mars = get_domain("mars")
    opened = []

    def spy(config, split):
        opened.append(split)
        return mars.open_split(config, split)

    monkeypatch.setitem(_REGISTRY, "mars", dataclasses.replace(mars, open_split=spy))
    train_small(tmp_path, "mars-tiny", "single", **{"run.steps": 2, "run.eval_every": 2, "model.depth": 1,
                                                   "data.eval_size": 8, "checkpoint.best_metric": "eval_loss"})
    assert "val" in opened and "test" not in opened, opened
    assert json.loads((tmp_path / "config.json").read_text())["data"]["eval_split"] == "val"
