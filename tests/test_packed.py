"""Packed datasets: `pack` turns a tree into ArrayRecord shards of records decoded once; every field
of every packed record equals the tree's record before augmentation, runs on the pack give the
tree's losses on 1 and 8 devices, a resume from the pack mid-epoch is exact, and a pack made with
other shaping keys, a missing or foreign shard are refused naming the key or the file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from trainutil import final_params, mesh_of, small_config, step_records
from triskele.train import train
from triskele.train.cli import main as train_main
from triskele.train.config.overrides import make_config
from triskele.train.data.packed import PackedRecords, decode_record, encode_record, shaping
from triskele.train.domains import get_domain
from triskele.train.tools.pack import pack_data

pytestmark = pytest.mark.xdist_group("packed")  # one tree and pack shared by the module

MARS_KEYS = get_domain("mars").pack_keys


def write_navcam_tree(root, frames=40, size=72):
    """An AI4Mars-layout tree: grey JPEG frames, labels, rover and range masks; one frame unlabelled."""
    rng = np.random.default_rng(0)
    msl = root / "msl"
    for k in range(frames):
        stem = f"NLA_{k:04d}EDR_F{k:02d}"
        rover, far = np.zeros((size, size)), np.zeros((size, size))
        rover[-4:], far[:3] = 1, 1
        for folder, name, array in (("images/edr", f"{stem}.JPG", rng.integers(0, 255, (size, size))),
                                    ("images/mxy", f"{stem.replace('EDR', 'MXY')}.png", rover),
                                    ("images/rng-30m", f"{stem.replace('EDR', 'RNG')}.png", far)):
            (msl / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.asarray(array, np.uint8)).save(msl / folder / name)
        if k == frames - 1:
            continue
        label = rng.integers(0, 4, (size // 8, size // 8)).repeat(8, 0).repeat(8, 1).astype(np.uint8)
        labels = msl / "labels" / ("test/masked-gold-min3-100agree" if k % 5 == 0 else "train")
        labels.mkdir(parents=True, exist_ok=True)
        Image.fromarray(label).save(labels / (f"{stem}_merged.png" if k % 5 == 0 else f"{stem}.png"))
    return root


@pytest.fixture(scope="module")
def mars_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("navcam")
    tree = write_navcam_tree(root / "tree")
    packed = root / "packed"
    config = make_config("mars-tiny", {"data.path": str(tree), "mars.scale": 0.5})
    summary = pack_data(config, packed, shard_records=7, progress=False)
    return tree, packed, summary


def test_every_packed_record_equals_the_trees_before_augmentation(mars_tree):
    tree, packed, summary = mars_tree
    assert {split: s["records"] for split, s in summary["splits"].items()} == {"train": 29, "val": 2, "test": 8}
    assert summary["splits"]["train"]["shards"] == 5 and summary["not_packed"] == {}
    config = make_config("mars-tiny", {"data.path": str(tree), "mars.scale": 0.5, "model.image_size": 16})
    domain = get_domain("mars")
    for split in ("train", "val", "test"):
        files = domain.open_split(config, split)
        records = PackedRecords.open(packed, split, shaping(config, MARS_KEYS))
        assert len(records) == len(files)
        for index in range(len(files)):
            want, got = files.decoded(index), records.decoded(index)
            assert set(want) == set(got) == {"image", "label"}
            for key in want:
                assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{split} {index} {key}")
        assert files.decoded(0)["image"].shape == (36, 36, 1)  # the frame at mars.scale 0.5
        assert (files.decoded(0)["label"][-2:] == 255).all()  # the rover mask merged (at the frame's size)


def test_a_run_on_the_pack_gives_the_trees_losses_on_1_and_8_devices_resumes_exactly_and_evaluates_alike(
        mars_tree, tmp_path):
    tree, packed, _ = mars_tree
    common = {"mars.scale": 0.5, "model.image_size": 16, "model.patch": 8, "data.global_batch": 8,
              "run.steps": 3, "data.val_fraction": 0.1}
    runs = {}
    for spec in ("single", "data=8"):
        for name, path in (("tree", tree), ("packed", packed)):
            workdir = tmp_path / f"{name}-{spec}"
            train(small_config(**common, **{"data.path": str(path)}), workdir=workdir, mesh=mesh_of(spec),
                  progress=False)
            runs[name, spec] = workdir
    for spec in ("single", "data=8"):
        tree_losses = {s: r["loss"] for s, r in step_records(runs["tree", spec]).items()}
        packed_losses = {s: r["loss"] for s, r in step_records(runs["packed", spec]).items()}
        assert sorted(tree_losses) == [1, 2, 3]
        for step, loss in tree_losses.items():
            assert packed_losses[step] == pytest.approx(loss, rel=1e-6), (spec, step)
    # 29 records at batch 8: 3 steps an epoch; stop at 2 (mid-epoch) and resume to 3.
    resumed = tmp_path / "resumed"
    config = small_config(**common, **{"data.path": str(packed)})
    train(config, workdir=resumed, mesh=mesh_of("single"), progress=False, stop_after_step=2)
    train(small_config(**common, **{"data.path": str(packed)}), workdir=resumed, mesh=mesh_of("single"),
          progress=False)
    assert step_records(resumed)[3]["loss"] == pytest.approx(step_records(runs["packed", "single"])[3]["loss"],
                                                             rel=1e-6)
    from triskele.eval.report import evaluate_checkpoint

    on_tree = evaluate_checkpoint(runs["tree", "single"], mesh="data=8", data=str(tree), output=tmp_path / "e1")
    on_pack = evaluate_checkpoint(runs["tree", "single"], mesh="data=8", data=str(packed), output=tmp_path / "e2")
    for key in ("miou", "pixel_acc"):
        assert on_pack["metrics"][key] == pytest.approx(on_tree["metrics"][key], rel=1e-6), key
    want, got = final_params(runs["packed", "single"])[0], final_params(resumed)[0]
    for a, b in zip(np.asarray(jax_leaves(want), dtype=object), jax_leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def test_a_pack_made_with_other_shaping_keys_is_refused_naming_them(mars_tree, tmp_path):
    tree, packed, _ = mars_tree
    config = small_config(**{"data.path": str(packed), "mars.scale": 1.0, "run.steps": 1})
    with pytest.raises(ValueError, match=r"mars\.scale: packed 0\.5, this run 1\.0"):
        train(config, workdir=tmp_path / "run", mesh=mesh_of("single"), progress=False)
    other = make_config("mars-tiny", {"data.path": str(tree), "mars.scale": 1.0})
    with pytest.raises(ValueError, match=r"other values of the keys that shape its records: mars\.scale"):
        pack_data(other, packed, progress=False)


def test_a_missing_truncated_or_foreign_shard_is_an_error_naming_the_file(mars_tree, tmp_path):
    import shutil

    _, packed, _ = mars_tree
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    config = make_config("mars-tiny", {"data.path": str(copy), "mars.scale": 0.5})
    wanted = shaping(config, MARS_KEYS)
    shard = copy / "train" / "shard-00001.array_record"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ValueError, match="shard"):
        PackedRecords.open(copy, "train", wanted).decoded(0)
    shard.write_bytes(b"not an array record " * 5000)
    with pytest.raises(ValueError, match="shard|packed record"):
        PackedRecords.open(copy, "train", wanted).decoded(9)
    shard.unlink()
    with pytest.raises(ValueError, match=f"shard {shard} is missing"):
        PackedRecords.open(copy, "train", wanted)
    with pytest.raises(ValueError, match="packed record 3 of .* is damaged"):
        decode_record(b"\x05\x00\x00\x00{bad}", f"3 of {copy / 'train'}")


def test_packing_resumes_after_an_interruption_and_writes_only_what_is_missing(mars_tree, tmp_path):
    import shutil

    tree, packed, _ = mars_tree
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    manifest = json.loads((copy / "pack.json").read_text())
    for name in ("shard-00002.array_record", "shard-00004.array_record"):  # killed while packing train
        (copy / "train" / name).unlink()
        del manifest["splits"]["train"]["digests"][name]
    manifest["splits"]["train"]["complete"] = False
    del manifest["splits"]["val"], manifest["splits"]["test"]
    (copy / "pack.json").write_text(json.dumps(manifest))
    (copy / "train" / ".shard-00002.array_record.x1.partial").write_bytes(b"half")
    assert train_main(["pack", "--preset", "mars-tiny", "--data", str(tree), "--output", str(copy), "--set",
                       "mars.scale=0.5", "--shard-records", "7", "--no-progress"]) == 0
    again = json.loads((copy / "pack.json").read_text())
    assert again["hash"] == json.loads((packed / "pack.json").read_text())["hash"]
    assert not list((copy / "train").glob(".*.partial"))


def test_the_codecs_round_trip_every_dtype():
    rng = np.random.default_rng(0)
    record = {"image": rng.integers(0, 255, (9, 7, 3), np.uint8), "grey": rng.integers(0, 255, (5, 4, 1), np.uint8),
              "label": np.int64(3) * np.ones(4, np.int64), "region": rng.random((6, 6)).astype(np.float32),
              "scalar": np.asarray(7, np.int32)}
    for codec in ("raw", "zlib", "png"):
        blob = encode_record(record, dict.fromkeys(record, codec))
        back = decode_record(blob, "test")
        for key, value in record.items():
            assert back[key].dtype == value.dtype and back[key].shape == value.shape
            np.testing.assert_array_equal(back[key], value, err_msg=f"{codec} {key}")


def assert_same_records(config, packed, keys, splits=("train", "val", "test")):
    """Every field of every record of each split: the pack's equals the tree's before augmentation."""
    from triskele.train.domains import resolve_from_data

    domain = resolve_from_data(config)
    for split in splits:
        files = domain.open_split(config, split)
        files = getattr(files, "packed_source", files)
        records = PackedRecords.open(packed, split, shaping(config, keys))
        assert len(records) == len(files) > 0, split
        for index in range(len(files)):
            want, got = files.decoded(index), records.decoded(index)
            assert set(want) == set(got), (split, set(want) ^ set(got))
            for key in want:
                assert np.asarray(got[key]).dtype == np.asarray(want[key]).dtype, (split, index, key)
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{split} {index} {key}")


def losses(workdir):
    return {step: record["loss"] for step, record in step_records(workdir).items()}


@pytest.mark.parametrize("fakes", ["supervised", "sbi"])
def test_deepfake_frames_pack_with_their_labels_videos_families_and_face_regions(fakes, tmp_path):
    from test_deepfake_data import write_ffpp

    write_ffpp(tmp_path / "tree")
    overrides = {"data.path": str(tmp_path / "tree"), "model.image_size": 16, "model.patch": 8,
                 "deepfake.frames_per_video": 4, "deepfake.fakes": fakes, "data.global_batch": 8,
                 "run.steps": 3, "data.val_fraction": 0.25}
    config = make_config("deepfake-tiny", overrides)
    summary = pack_data(config, tmp_path / "packed", shard_records=5, progress=False)
    assert set(summary["splits"]) == {"train", "val", "test"}, summary["not_packed"]
    keys = get_domain("deepfake").pack_keys
    assert_same_records(make_config("deepfake-tiny", overrides), tmp_path / "packed", keys)
    runs = {}
    for name, path in (("tree", tmp_path / "tree"), ("packed", tmp_path / "packed")):
        for spec in ("single", "data=8"):
            runs[name, spec] = tmp_path / f"{name}-{spec}"
            train(small_config("deepfake-tiny", **{**overrides, "data.path": str(path)}), workdir=runs[name, spec],
                  mesh=mesh_of(spec), progress=False)
    for spec in ("single", "data=8"):
        tree, packed = losses(runs["tree", spec]), losses(runs["packed", spec])
        assert sorted(tree) == [1, 2, 3]
        for step in tree:
            assert packed[step] == pytest.approx(tree[step], rel=1e-6), (fakes, spec, step)


def test_product_crops_pack_with_their_classes_kinds_and_gallery(tmp_path):
    from test_merch import write_products

    write_products(tmp_path / "tree")
    overrides = {"data.path": str(tmp_path / "tree"), "model.image_size": 16, "model.patch": 8,
                 "data.global_batch": 4, "run.steps": 3, "data.val_fraction": 0.2}
    pack_data(make_config("merch-tiny", overrides), tmp_path / "packed", progress=False)
    assert_same_records(make_config("merch-tiny", overrides), tmp_path / "packed", get_domain("merch").pack_keys)
    runs = {}
    for name, path in (("tree", tmp_path / "tree"), ("packed", tmp_path / "packed")):
        runs[name] = tmp_path / name
        train(small_config("merch-tiny", **{**overrides, "data.path": str(path)}), workdir=runs[name],
              mesh=mesh_of("single"), progress=False)
    assert json.loads((runs["packed"] / "config.json").read_text())["model"]["class_names"] == ["cola", "tea"]
    tree, packed = losses(runs["tree"]), losses(runs["packed"])
    assert sorted(tree) == [1, 2, 3] and all(packed[s] == pytest.approx(tree[s], rel=1e-6) for s in tree)
