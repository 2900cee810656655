"""Paths stay where they belong: predict's output folder never overwrites or re-reads its inputs,
a walk over a tree with link cycles ends and lists each file once, and the names a dataset's split
file gives stay inside the dataset."""

import hashlib
import json
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_deepfake_data import write_ffpp
from triskele.eval.cli import main as eval_main
from triskele.eval.engine import predict_files
from triskele.eval.inputs import list_inputs
from triskele.eval.model import load_model
from triskele.train.domains.deepfake.data import FaceFrames

LEGACY_RUN = Path(__file__).parent / "fixtures" / "legacy" / "mars-run"
"""A mars checkpoint (16 px, depth 1) kept in the repository."""


@pytest.fixture(scope="module")
def mars_run(tmp_path_factory):
    return shutil.copytree(LEGACY_RUN, tmp_path_factory.mktemp("input-paths") / "mars-run")


@pytest.fixture(scope="module")
def mars(mars_run):
    from triskele.eval.domains.mars import predict_io

    model = load_model(mars_run, mesh="data=8")
    return model, predict_io(model.meta, {})


def _images(folder: Path, *names: str) -> dict[str, str]:
    """Small PNGs at `names` under `folder`: name -> digest of its bytes."""
    for i, name in enumerate(names):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((16, 16), 40 * i, np.uint8)).save(folder / name)
    return _digests(folder, names)


def _digests(folder: Path, names) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in names}


# --- the output folder is never an input folder, nor inside one ---------------------------------

def test_an_output_folder_that_is_the_input_folder_is_refused_and_nothing_is_overwritten(mars_run, tmp_path,
                                                                                         capsys):
    before = _images(tmp_path / "photos", "a.png", "b.png")
    code = eval_main(["predict", "--workdir", str(mars_run), "--input", str(tmp_path / "photos"), "--output",
                      str(tmp_path / "photos"), "--mesh", "data=8", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"is the input folder {(tmp_path / 'photos').resolve()}" in err and "give an --output outside" in err, err
    assert _digests(tmp_path / "photos", before) == before
    assert sorted(p.name for p in (tmp_path / "photos").iterdir()) == ["a.png", "b.png"]


def test_an_output_folder_reached_by_a_link_is_compared_resolved(mars, tmp_path):
    model, io = mars
    before = _images(tmp_path / "photos", "a.png")
    (tmp_path / "out").symlink_to("photos")
    with pytest.raises(ValueError, match=r"--output .*out \(resolved: .*photos\) is the input folder"):
        predict_files(model, io, tmp_path / "photos", tmp_path / "out", progress=False)
    assert _digests(tmp_path / "photos", before) == before


def test_an_output_folder_inside_the_input_tree_is_refused_before_its_predictions_are_read_again(mars, tmp_path):
    model, io = mars
    _images(tmp_path / "photos", "a.png", "sub/b.png")
    for spec in (tmp_path / "photos", f"{tmp_path}/photos/**/*.png", f"{tmp_path}/photos/*/*.png"):
        with pytest.raises(ValueError, match="is inside the input folder .*photos-predictions"):
            predict_files(model, io, spec, tmp_path / "photos" / "pred", progress=False)
        assert not (tmp_path / "photos" / "pred").exists()
    # a glob that can never list a file of OUT leaves it be, and its rerun predicts nothing again
    for _ in range(2):
        summary = predict_files(model, io, f"{tmp_path}/photos/*.png", tmp_path / "photos" / "pred", progress=False)
    assert (summary["inputs"], summary["skipped"]) == (1, 1)
    assert not (tmp_path / "photos" / "pred" / "pred").exists()


def test_a_list_or_glob_naming_files_inside_the_output_folder_is_refused(mars, tmp_path):
    model, io = mars
    before = _images(tmp_path, "photos/a.png", "out/old.png")
    (tmp_path / "list.txt").write_text("photos/a.png\nout/old.png\n")
    for spec, why in ((tmp_path / "list.txt", r"names 1 files inside --output .*out \(e.g. .*old.png\)"),
                      (tmp_path / "out" / "old.png", r"names 1 files inside --output .*out \(e.g. .*old.png\)"),
                      (f"{tmp_path}/*/*.png", "is inside the input folder"),
                      (f"{tmp_path}/out/*.png", "is the input folder")):
        with pytest.raises(ValueError, match=why):
            predict_files(model, io, spec, tmp_path / "out", progress=False)
    assert _digests(tmp_path, before) == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["old.png"]


# --- a walk follows each folder once -----------------------------------------------------------

def _listed(spec, seconds: float = 20.0) -> list[str]:
    """The input keys `list_inputs` gives for `spec`, failing if the listing runs past `seconds`."""
    found: list = []
    listing = threading.Thread(target=lambda: found.append(list_inputs(spec, (".png",))), daemon=True)
    listing.start()
    listing.join(seconds)
    assert not listing.is_alive(), f"listing {spec} did not end in {seconds} s"
    root, files = found[0]
    return [f.relative_to(root).as_posix() for f in files]


@pytest.mark.parametrize("loops", [("l1",), ("l1", "l2")])
@pytest.mark.parametrize("glob", [False, True])
def test_links_to_folders_are_followed_once_and_a_link_cycle_ends(tmp_path, loops, glob):
    _images(tmp_path, "photos/a.png", "photos/sub/b.png", "elsewhere/c.png")
    (tmp_path / "photos" / "more").symlink_to(tmp_path / "elsewhere")  # followed: a tree assembled from links
    for name in loops:
        (tmp_path / "photos" / "sub" / name).symlink_to("..")  # back up the tree
    spec = f"{tmp_path}/photos/**/*.png" if glob else tmp_path / "photos"
    assert _listed(spec) == ["a.png", "more/c.png", "sub/b.png"]


def test_a_file_reached_by_two_names_is_listed_once_under_the_first(tmp_path):
    _images(tmp_path, "a.png", "sub/c.png")
    (tmp_path / "b.png").symlink_to("a.png")
    (tmp_path / "link").symlink_to("sub")
    assert _listed(tmp_path) == ["a.png", "link/c.png"]
    (tmp_path / "list.txt").write_text("b.png\na.png\nsub/c.png\nlink/c.png\n")
    assert _listed(tmp_path / "list.txt") == ["b.png", "sub/c.png"]


# --- names in a dataset's split file stay inside the dataset ------------------------------------

@pytest.mark.parametrize("name", ["/elsewhere/frames", "../../../../elsewhere", "000/../../001"])
def test_a_split_file_naming_a_video_outside_the_dataset_is_refused_naming_file_and_entry(tmp_path, name):
    write_ffpp(tmp_path / "ffpp")
    pairs = [["000", "001"], [name, "001"]]
    (tmp_path / "ffpp" / "splits" / "train.json").write_text(json.dumps(pairs))
    why = "is an absolute path" if name.startswith("/") else "climbs out with '..'"
    entry = f"entry 2 {json.dumps(pairs[1])}"
    with pytest.raises(ValueError, match=re.escape(f"splits/train.json, {entry}: '{name}' {why}")):
        FaceFrames(tmp_path / "ffpp", "train", 16, frames_per_video=3)
