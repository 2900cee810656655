"""DeepfakeBench's dataset JSON (`preprocessing/rearrange.py` writes `<Dataset>.json`): {dataset:
{label: {split: {video: {"label": label, "frames": [paths]}}}}}, FaceForensics++'s with a
compression level between split and video ({split: {"c23": {video: ...}}}). Its frames are the face
crops DeepfakeBench's preprocessing made, read as they are (nothing to prepare). A video's label
is one of DeepfakeBench's `label_dict` (`training/config/train_config.yaml`); its name is
`<label>/<video>` (DeepfakeBench's own unique name is `<label>_<video>`). A frame path, relative (to
the JSON's folder: DeepfakeBench's `rgb_dir`, where the JSON or a link to it goes) or absolute,
names a file inside the JSON's folder; `\\` separators (JSONs written on Windows) read as `/`."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from triskele.train.data.splits import SPLITS
from triskele.train.domains.deepfake.layouts.base import Layout, Listing, Tree, Video

LABELS = {
    "DFD_fake": 1, "DFD_real": 0,
    "FF-SH": 1, "FF-F2F": 1, "FF-DF": 1, "FF-FS": 1, "FF-NT": 1, "FF-FH": 1, "FF-real": 0,
    "CelebDFv1_real": 0, "CelebDFv1_fake": 1, "CelebDFv2_real": 0, "CelebDFv2_fake": 1,
    "DFDCP_Real": 0, "DFDCP_FakeA": 1, "DFDCP_FakeB": 1,
    "DFDC_Fake": 1, "DFDC_Real": 0,
    "DF_fake": 1, "DF_real": 0,
    "UADFV_Fake": 1, "UADFV_Real": 0,
    "roop_Real": 0, "roop_Fake": 1,
}
"""DeepfakeBench's `label_dict` (train_config.yaml and test_config.yaml, SCLBD/DeepfakeBench at
8a4a7bf): label -> 0 real, 1 fake."""


def _frame(text: Any, base: Path, where: str) -> Path:
    if not isinstance(text, str) or not text:
        raise ValueError(f"{where}: frame {text!r} is not a path")
    root = Path(os.path.normpath(base.absolute()))
    full = Path(os.path.normpath(root / text.replace("\\", "/")))  # an absolute path stays itself
    if not full.is_relative_to(root):
        raise ValueError(f"{where}: frame {text!r} lies outside {base}, the JSON's folder; put the JSON (or a link "
                         "to it) in the folder that holds the datasets (DeepfakeBench's rgb_dir)")
    return full


def _number(path: Path) -> tuple[int, str]:
    return (int(path.stem), path.name) if path.stem.isdigit() else (1 << 62, path.name)


def _videos(node: Any, compression: str | None, where: str) -> list[tuple[str, dict]]:
    """(video, entry) of one split's node, through a compression level where there is one."""
    if not isinstance(node, dict):
        raise ValueError(f"{where} is not an object of videos")
    if node and all(isinstance(v, dict) and "frames" not in v for v in node.values()):  # a compression level
        levels = [compression] if compression is not None else sorted(node)
        if compression is not None and compression not in node:
            raise ValueError(f"{where} has no compression level {compression!r} (deepfake.compression); it has "
                             f"{sorted(node)}")
        return [item for level in levels for item in _videos(node[level], None, f"{where}/{level}")]
    return list(node.items())


def read_deepfakebench(tree: Tree, compression: str | None) -> Listing:
    file = tree.root
    base = file.parent
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{file} is not DeepfakeBench's dataset JSON: {err}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{file} is not DeepfakeBench's dataset JSON ({{dataset: {{label: {{split: ...}}}}}})")
    videos, empty = [], 0
    for dataset, labels in data.items():
        for label_key, splits in labels.items():
            if not isinstance(splits, dict):
                raise ValueError(f"{file}: {dataset}/{label_key} is not an object of splits")
            for split, node in splits.items():
                if split not in SPLITS:
                    raise ValueError(f"{file}: {dataset}/{label_key} has split {split!r}; the splits are "
                                     f"{', '.join(SPLITS)}")
                for video, entry in _videos(node, compression, f"{file}: {dataset}/{label_key}/{split}"):
                    where = f"{file}: {dataset}/{label_key}/{split}/{video}"
                    label = entry.get("label") if isinstance(entry, dict) else None
                    if label not in LABELS:
                        raise ValueError(f"{where}: label {label!r} is not one of DeepfakeBench's labels "
                                         f"({', '.join(LABELS)})")
                    frames = entry.get("frames")
                    if not isinstance(frames, list):
                        raise ValueError(f"{where}: 'frames' is not a list of paths")
                    if not frames:
                        empty += 1
                        continue
                    paths = tuple(sorted((_frame(f, base, where) for f in frames), key=_number))
                    name = f"{label}/{video}"
                    fake = LABELS[label] == 1
                    videos.append(Video(name, name, LABELS[label], split, label if fake else "real",
                                        str(PurePosixPath(str(video)).name).split("_")[0], (str(file), name), paths))
    notes = [f"{empty} videos listed without frames left out"] if empty else []
    return Listing(videos, notes, files=[file])


DEEPFAKEBENCH = Layout(
    name="deepfakebench", title="DeepfakeBench JSON", read=read_deepfakebench,
    expects="a DeepfakeBench dataset JSON file (<Dataset>.json, its frames beside it)",
    detect=lambda root: root.is_file() and root.suffix.lower() == ".json", frames_only=True,
)
