"""How a run's faces are cropped, a property of the run (`deepfake.face_crops`), never of the machine
it runs on: `aligned` on 5 landmarks (`align`; needs the landmarks extra) or `box`, the detector's
box enlarged 1.3x (`faces.crop_face`); `auto` for a run on the synthetic renders, which were cropped
by neither (`SYNTHETIC`). Training records the method of the faces it trains on (a prepared tree's,
from its manifest.json, or the synthetic renders'); predict and serve crop videos the run's way,
and evaluation refuses a prepared tree cropped the other way."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from triskele.train.domains.deepfake.landmarks import INSTALL, landmark_predictor, predictor_path, say_once

ALIGNED, BOX, AUTO = "aligned", "box", "auto"
FACE_CROPS = (ALIGNED, BOX, AUTO)
OLD_RUNS = BOX
"""The method of a run saved before `deepfake.face_crops` existed: box crops, all there was before
the landmarks extra."""
SYNTHETIC = AUTO
"""Synthetic faces were cropped by neither method, and are framed as aligned crops are, so a run on
them crops videos aligned where the landmarks extra is installed and by the box where it is not
(as before the extra; `usable_crops` says so once): the similarity that takes a drawn face's 5
alignment points onto `align.alignment_template(256, 1.3)` scales by 0.985 (sd 0.048 over 200
identities), the points lying 0.048 of the side from the template as drawn, where dlib's points on
the test photograph's face in its 1.3x box crop need a scale of 0.643 and lie 0.149 away. As
fractions of the side: upper lids (points 37, 44) 0.27 apart (0.23 to 0.32) at height 0.44, mouth at 0.71 in the
drawings; 0.24, 0.47, 0.75 in the template; 0.43, 0.26, 0.67 in the box crop."""
MANIFEST = "manifest.json"


def check_face_crops(name: str | None) -> str:
    """`name` if it is one of `FACE_CROPS`, else a ValueError naming the key and the choices."""
    if name not in FACE_CROPS:
        raise ValueError(f"config key 'deepfake.face_crops' is {name!r}; choose one of {', '.join(FACE_CROPS)}")
    return name


def entry_crops(entry: Mapping[str, Any]) -> str:
    """The method of one manifest entry (entries written before `prepare` recorded it: aligned where
    it stored landmarks, which only aligned crops have)."""
    return entry.get("crops") or (ALIGNED if entry.get("landmarks_written") else BOX)


def crops_of_entries(entries: Iterable[Mapping[str, Any]], where: str) -> str | None:
    """The one method of the entries that wrote crops (None: none did); a ValueError naming `where`
    and some videos of each method when they mix both."""
    videos: dict[str, list[str]] = {}
    for entry in entries:
        if entry.get("frames_written"):
            videos.setdefault(entry_crops(entry), []).append(entry["video"])
    if len(videos) > 1:
        listed = "; ".join(f"{method}: {len(names)} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                           for method, names in sorted(videos.items()))
        raise ValueError(f"{where} lists videos prepared with both kinds of face crops ({listed}); a model sees one "
                         "kind: prepare the videos again into a new --output with one --crops (aligned or box)")
    return next(iter(videos), None)


def prepared_crops(root: Path) -> str | None:
    """The method of the face crops `prepare` wrote at `root`, from its manifest.json; None for data
    no manifest describes (a DeepfakeBench dataset JSON, a tree made otherwise)."""
    manifest = Path(root) / MANIFEST
    if not manifest.is_file():
        return None
    return crops_of_entries(json.loads(manifest.read_text()).get("videos", []), str(manifest))


def training_crops(data_path: str | None) -> str:
    """The method of the faces a run trains on: the synthetic renders' (`SYNTHETIC`) without
    `data.path`, else the prepared tree's; `box` where no manifest says (as before the extra)."""
    if not data_path:
        return SYNTHETIC
    return (prepared_crops(Path(data_path)) if Path(data_path).is_dir() else None) or BOX


def check_aligner(asked: str) -> None:
    """Aligned crops need dlib's 68-point model: a ValueError saying what `asked` for them and the fix
    when the landmarks extra is not installed; a damaged model file is refused here too, before any
    input is read."""
    if predictor_path() is None:
        raise ValueError(f"{asked}; aligning needs the landmarks extra (dlib's 68-point landmark model), which is "
                         f"not installed: {INSTALL}")
    landmark_predictor()


def usable_crops(method: str) -> str:
    """The method videos are cropped by for a run of `method`: `auto`, aligned where the landmarks
    extra is installed, else box (said once); the others as they are."""
    if method != AUTO:
        return method
    if predictor_path() is not None:
        return ALIGNED
    say_once("face crops: this run trained on synthetic faces (deepfake.face_crops=auto); without the landmarks "
             f"extra its videos' faces are cropped by the detector's box, not aligned ({INSTALL} to align them)")
    return BOX


def run_crops(options: Mapping[str, Any]) -> str:
    """The method a model's recorded domain options name (an export made before they named one: `OLD_RUNS`)."""
    return check_face_crops(options.get("face_crops", OLD_RUNS))
