"""Paths stay inside their dataset: a walk over a tree with link cycles ends and lists each file
once, and the names a dataset's split file gives stay inside the dataset (issue 37, item 6)."""

import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_deepfake_data import write_ffpp
from triskele.eval.inputs import list_inputs
from triskele.train.domains.deepfake.data import FaceFrames


def _images(folder: Path, *names: str) -> None:
    """Small PNGs at `names` under `folder`."""
    for i, name in enumerate(names):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((16, 16), 40 * i, np.uint8)).save(folder / name)


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
