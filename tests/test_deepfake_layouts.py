"""The cross-dataset layouts: what each one's files say about its videos, and the
errors that name a file contradicting its layout. Trees of empty placeholder videos: nothing is
decoded here (tests/test_cross_dataset.py prepares and evaluates trees of real test videos)."""

import json

import pytest
from triskele.train.cli import main as train_main
from triskele.train.domains.deepfake.data import FaceFrames
from triskele.train.domains.deepfake.layouts import Tree, find_layout, split_videos
from triskele.train.domains.deepfake.prepare import prepare_deepfake


def _touch(root, *names):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")


def _rows(root, split, val_fraction=0.0, **options):
    """name -> (label, family) of split `split` of the raw tree `root`, and the layout's title."""
    layout = find_layout(root)
    tree = Tree(root, prepared=False)
    videos, _ = split_videos(layout, layout.read(tree, None), tree, split, val_fraction, **options)
    return layout.title, {v.name: (v.label, v.family) for v in videos}


CELEB_LIST = "1 Celeb-real/id0_0000.mp4\n1 YouTube-real/00000.mp4\n0 Celeb-synthesis/id0_id1_0000.mp4\n"


def celeb_df(root, listing=CELEB_LIST):
    _touch(root, "Celeb-real/id0_0000.mp4", "Celeb-real/id1_0000.mp4", "YouTube-real/00000.mp4",
           "Celeb-synthesis/id0_id1_0000.mp4", "Celeb-synthesis/id1_id0_0000.mp4")
    (root / "List_of_testing_videos.txt").write_text(listing)
    return root


def test_celeb_df_list_gives_the_test_split_its_first_column_1_is_real(tmp_path):
    root = celeb_df(tmp_path)
    title, test = _rows(root, "test")
    assert title == "Celeb-DF"
    assert test == {"Celeb-real/id0_0000": (0, "real"), "YouTube-real/00000": (0, "real"),
                    "Celeb-synthesis/id0_id1_0000": (1, "Celeb-synthesis")}
    _, train = _rows(root, "train")
    assert train == {"Celeb-real/id1_0000": (0, "real"), "Celeb-synthesis/id1_id0_0000": (1, "Celeb-synthesis")}


@pytest.mark.parametrize("line, says", [
    ("2 Celeb-real/id1_0000.mp4", r"line 2: '2 Celeb-real/id1_0000.mp4' is not '<label> <folder>/<video>.mp4'"),
    ("1 Celeb-synthesis/id1_id0_0000.mp4", r"line 2: label 1 \(real\) for 'Celeb-synthesis/id1_id0_0000.mp4', a "
                                           r"video of the fake folder Celeb-synthesis/"),
    ("0 Celeb-real/id1_0000.mp4", r"line 2: label 0 \(fake\) for 'Celeb-real/id1_0000.mp4', a video of the real"),
    ("1 Elsewhere/x.mp4", r"line 2: 'Elsewhere/x.mp4' is not in Celeb-real, YouTube-real or Celeb-synthesis/"),
    ("1 ../Celeb-real/x.mp4", r"line 2: '../Celeb-real/x.mp4' climbs out with '..'"),
    ("1 Celeb-real/id9_0000.mp4", r" line 2 lists real video 'Celeb-real/id9_0000.mp4' but .*Celeb-real/id9_0000.mp4 "
                                  r"does not exist"),
])
def test_celeb_df_lines_that_contradict_the_layout_name_the_file_and_line(tmp_path, line, says):
    root = celeb_df(tmp_path, f"1 Celeb-real/id0_0000.mp4\n{line}\n")
    with pytest.raises(ValueError, match=f"List_of_testing_videos.txt.*{says}"):
        prepare_deepfake(root, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists(), "nothing is prepared from a tree whose files contradict it"


def dfdc(root, labels="filename,label\naaa.mp4,0\nbbb.mp4,1\n", metadata=None):
    _touch(root, "test/aaa.mp4", "test/videos/bbb.mp4", "train/dfdc_train_part_0/r.mp4",
           "train/dfdc_train_part_0/f.mp4")
    (root / "test" / "labels.csv").write_text(labels)
    metadata = metadata or {"r.mp4": {"label": "REAL", "split": "train"},
                            "f.mp4": {"label": "FAKE", "split": "train", "original": "r.mp4"}}
    (root / "train" / "dfdc_train_part_0" / "metadata.json").write_text(json.dumps(metadata))
    return root


def test_dfdc_test_labels_1_is_fake_and_training_parts_metadata(tmp_path):
    root = dfdc(tmp_path)
    title, test = _rows(root, "test")
    assert title == "DFDC"
    assert test == {"test/aaa": (0, "real"), "test/videos/bbb": (1, "DFDC")}, "test/ or test/videos/ both read"
    _, train = _rows(root, "train")
    assert train == {"train/dfdc_train_part_0/r": (0, "real"), "train/dfdc_train_part_0/f": (1, "DFDC")}
    layout = find_layout(root)
    groups = {v.name: v.group for v in layout.read(Tree(root, False), None).videos}
    assert groups["train/dfdc_train_part_0/f"] == groups["train/dfdc_train_part_0/r"], "a fake goes with its original"


@pytest.mark.parametrize("labels, metadata, says", [
    ("filename,label\naaa.mp4,0\nbbb.mp4,FAKE\n", None, r"test/labels.csv line 3: label 'FAKE' for 'bbb.mp4'"),
    ("filename,label\naaa.mp4,0\nzzz.mp4,1\n", None, r"test/labels.csv line 3 lists fake video 'zzz.mp4' but "
                                                     r".*test/zzz.mp4 does not exist"),
    ("name,fake\naaa.mp4,0\n", None, r"test/labels.csv: columns \['name', 'fake'\] lack filename and label"),
    (None, {"r.mp4": {"label": "real"}}, r"metadata.json, 'r.mp4': label 'real'; DFDC's labels are REAL and FAKE"),
    (None, {"r.mp4": {"label": "REAL"}, "gone.mp4": {"label": "FAKE"}},
     r"metadata.json lists fake video 'gone.mp4' but .*dfdc_train_part_0/gone.mp4 does not exist"),
])
def test_dfdc_files_that_contradict_the_layout_name_the_file(tmp_path, labels, metadata, says):
    root = dfdc(tmp_path, **({"labels": labels} if labels else {}), metadata=metadata)
    with pytest.raises(ValueError, match=says):
        prepare_deepfake(root, tmp_path / "out", progress=False)


def dfdcp(root, index=None):
    index = index or {"original_videos/1/a.mp4": {"label": "real", "set": "test"},
                      "original_videos/2/b.mp4": {"label": "real", "set": "train"},
                      "method_A/1/1_A/a_A.mp4": {"label": "fake", "set": "test"},
                      "method_B/2/b_B.mp4": {"label": "fake", "set": "train"}}
    _touch(root, *(name for name in index if name != "method_A/missing.mp4"))
    (root / "dataset.json").write_text(json.dumps(index))
    return root


def test_dfdcp_index_gives_labels_sets_and_the_method_as_family(tmp_path):
    root = dfdcp(tmp_path)
    title, test = _rows(root, "test")
    assert title == "DFDCP"
    assert test == {"original_videos/1/a": (0, "real"), "method_A/1/1_A/a_A": (1, "method_A")}
    assert _rows(root, "train")[1] == {"original_videos/2/b": (0, "real"), "method_B/2/b_B": (1, "method_B")}
    assert _rows(root, "test", methods=("method_A",))[1] == test
    with pytest.raises(ValueError, match=r"method 'method_C' not under .*; methods there: \['method_A', 'method_B'\]"):
        _rows(root, "test", methods=("method_C",))


@pytest.mark.parametrize("entry, says", [
    ({"label": "FAKE", "set": "test"}, r"dataset.json, 'method_A/missing.mp4': label 'FAKE'; DFDCP's labels are real "
                                       r"and fake"),
    ({"label": "fake", "set": "val"}, r"dataset.json, 'method_A/missing.mp4': set 'val'; DFDCP's sets are train and"),
    ({"label": "fake", "set": "test"}, r"dataset.json lists fake video 'method_A/missing.mp4' but "
                                       r".*method_A/missing.mp4 does not exist"),
])
def test_dfdcp_entries_that_contradict_the_layout_name_the_file(tmp_path, entry, says):
    root = dfdcp(tmp_path, {"original_videos/1/a.mp4": {"label": "real", "set": "test"}, "method_A/missing.mp4": entry})
    with pytest.raises(ValueError, match=says):
        prepare_deepfake(root, tmp_path / "out", progress=False)


def test_uadfv_is_detected_by_its_fake_names_and_pairs_each_fake_with_its_real(tmp_path):
    _touch(tmp_path, "real/0000.mp4", "real/0001.mp4", "fake/0000_fake.mp4", "fake/0001_fake.mp4")
    title, test = _rows(tmp_path, "test")
    assert title == "UADFV"
    assert test == {"real/0000": (0, "real"), "real/0001": (0, "real"), "fake/0000_fake": (1, "fake"),
                    "fake/0001_fake": (1, "fake")}
    _, val = _rows(tmp_path, "val", val_fraction=0.5)
    assert sorted(name.split("/")[1][:4] for name in val) == ["0001", "0001"], "a real and its fake held out together"
    _touch(tmp_path, "fake/other.mp4")
    assert _rows(tmp_path, "test")[0] == "generic", "a fake not named <real>_fake: the generic layout"


def test_a_named_layout_is_used_and_an_unknown_one_refused(tmp_path, capsys):
    _touch(tmp_path / "raw", "real/0000.mp4", "fake/0000_fake.mp4")
    assert find_layout(tmp_path / "raw", "generic").title == "generic"
    with pytest.raises(ValueError, match=r"deepfake.layout 'celebdf' is not a deepfake layout; choose auto"):
        find_layout(tmp_path / "raw", "celebdf")
    with pytest.raises(ValueError, match=r"--input '.*nothing' matches no deepfake layout: expected .*Celeb-DF: "
                                         r"Celeb-real, .*; or name the layout with --layout"):
        _touch(tmp_path / "nothing", "clip.mp4")
        prepare_deepfake(tmp_path / "nothing", tmp_path / "out", progress=False)
    json_file = tmp_path / "raw.json"
    json_file.write_text("{}")
    assert train_main(["prepare", "deepfake", "--input", str(json_file), "--output", str(tmp_path / "out")]) == 2
    assert "a DeepfakeBench dataset JSON lists face crops its preprocessing made already" in capsys.readouterr().err


# --- DeepfakeBench's dataset JSON, read directly --------------------------------------------------

def _crops(folder, count):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (12, 12), (40 * i, 90, 30)).save(folder / f"{i:03d}.png")
    return [folder / f"{i:03d}.png" for i in range(count)]


def deepfakebench(root, label="CelebDFv2_fake", frame_path=None):
    """A Celeb-DF-v2.json as DeepfakeBench's rearrange.py writes it, frames beside it: relative paths
    (with Windows separators for one video) and an absolute one."""
    real = _crops(root / "Celeb-DF-v2" / "Celeb-real" / "frames" / "id0_0000", 3)
    fake = _crops(root / "Celeb-DF-v2" / "Celeb-synthesis" / "frames" / "id0_id1_0000", 3)
    other = _crops(root / "Celeb-DF-v2" / "Celeb-real" / "frames" / "id1_0000", 2)
    entry = lambda lab, paths: {"label": lab, "frames": paths}
    data = {"Celeb-DF-v2": {
        "CelebDFv2_real": {"train": {"id1_0000": entry("CelebDFv2_real", [str(p) for p in other])},
                           "test": {"id0_0000": entry("CelebDFv2_real", [
                               str(p.relative_to(root)).replace("/", "\\") for p in reversed(real)])}},
        "CelebDFv2_fake": {"test": {"id0_id1_0000": entry(label, [frame_path or str(p.relative_to(root))
                                                                 for p in fake]), "empty": entry(label, [])}},
    }}
    (root / "Celeb-DF-v2.json").write_text(json.dumps(data))
    return root / "Celeb-DF-v2.json", real, fake


def test_deepfakebench_json_is_read_directly_with_its_splits_labels_and_sorted_frames(tmp_path):
    path, real, fake = deepfakebench(tmp_path)
    files = FaceFrames(path, "test", 16, frames_per_video=8)
    assert files.layout == "DeepfakeBench JSON"
    assert files.video_names == ["CelebDFv2_real/id0_0000", "CelebDFv2_fake/id0_id1_0000"]
    assert [paths[0] for paths, _, _ in files.records] == real + fake, "frames in their numbers' order"
    assert [label for _, label, _ in files.records] == [0, 0, 0, 1, 1, 1]
    assert files.family_names == ("real", "CelebDFv2_fake")
    assert "1 videos listed without frames left out" in files.report()
    assert files.load(3)["image"].shape == (16, 16, 3)
    train = FaceFrames(path, "train", 16, 8, reals_only=True)
    assert train.video_names == ["CelebDFv2_real/id1_0000"] and len(train) == 2


@pytest.mark.parametrize("label, frame, says", [
    ("CelebDFv3_fake", None, r"Celeb-DF-v2.json: Celeb-DF-v2/CelebDFv2_fake/test/id0_id1_0000: label "
                             r"'CelebDFv3_fake' is not one of DeepfakeBench's labels"),
    ("CelebDFv2_fake", "Celeb-DF-v2/Celeb-synthesis/frames/id0_id1_0000/099.png",
     r"Celeb-DF-v2.json lists fake video 'CelebDFv2_fake/id0_id1_0000' but its frame .*099.png does not exist"),
    ("CelebDFv2_fake", "/etc/passwd", r"frame '/etc/passwd' lies outside .*, the JSON's folder"),
    ("CelebDFv2_fake", "../x/000.png", r"frame '../x/000.png' lies outside"),
])
def test_deepfakebench_entries_that_contradict_the_format_name_the_file_and_video(tmp_path, label, frame, says):
    path, _, _ = deepfakebench(tmp_path, label, frame)
    with pytest.raises(ValueError, match=says):
        FaceFrames(path, "test", 16, 8)


def test_ffpp_raw_tree_reads_each_compression_there_and_leaves_out_a_method_the_pairs_do_not_name(tmp_path):
    real, fake = "original_sequences/youtube/c23/videos", "manipulated_sequences/Deepfakes"
    _touch(tmp_path, f"{real}/000.mp4", f"{real}/001.mp4", f"{fake}/c23/videos/000_001.mp4",
           f"{fake}/c23/videos/001_000.mp4", f"{fake}/c40/videos/000_001.mp4", f"{fake}/c40/videos/001_000.mp4",
           "manipulated_sequences/DeepFakeDetection/c23/videos/01_02__outside_talking__YVGY8LOK.mp4")
    (tmp_path / "splits").mkdir()
    (tmp_path / "splits" / "test.json").write_text(json.dumps([["000", "001"]]))
    layout, tree = find_layout(tmp_path), Tree(tmp_path, prepared=False)
    videos, notes = split_videos(layout, layout.read(tree, None), tree, "test")
    assert [v.key.split("/", 2)[2] for v in videos] == [
        "c23/videos/000", "c23/videos/001", "c23/videos/000_001", "c23/videos/001_000", "c40/videos/000_001",
        "c40/videos/001_000"], "no c40 reals asked for where there are none"
    assert notes == ["DeepFakeDetection: no video named as the split files' pairs are, left out"]
    (tmp_path / fake / "c40" / "videos" / "001_000.mp4").unlink()
    with pytest.raises(ValueError, match=r"splits/test.json lists fake video '001_000' but .*c40/videos/001_000.mp4"):
        prepare_deepfake(tmp_path, tmp_path / "out", progress=False)
