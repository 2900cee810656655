"""The deepfake dataset layouts `prepare deepfake` and `--data` read, one reader each: FaceForensics++,
Celeb-DF v1/v2, DFDC, DFDCP, UADFV, the generic real/fake folders and DeepfakeBench's dataset JSON.

A layout is detected from its root (first match in `LAYOUTS`' order; a prepared tree's manifest
records the layout `prepare` read) or named (`--layout NAME`, `deepfake.layout`). Its reader gives
the rows (`Video`: where, label, split, family); `split_videos` picks a split's, with the training
methods and the held-out validation as every layout has them, and checks that each video a file
lists is there."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from triskele.train.data.splits import hold_out
from triskele.train.domains.deepfake.layouts.base import Layout, Listing, Tree, Video, frames_key
from triskele.train.domains.deepfake.layouts.celebdf import CELEB_DF
from triskele.train.domains.deepfake.layouts.deepfakebench import DEEPFAKEBENCH
from triskele.train.domains.deepfake.layouts.dfdc import DFDC
from triskele.train.domains.deepfake.layouts.dfdcp import DFDCP
from triskele.train.domains.deepfake.layouts.ffpp import FFPP
from triskele.train.domains.deepfake.layouts.folders import GENERIC, UADFV

__all__ = ["AUTO", "LAYOUTS", "Layout", "Listing", "Tree", "Video", "check_layout_name", "find_layout", "frames_key",
           "listed_present", "split_videos"]

AUTO = "auto"
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (DEEPFAKEBENCH, FFPP, DFDCP, DFDC, CELEB_DF, UADFV,
                                                                 GENERIC)}
"""By name, in the order detection tries them."""


def check_layout_name(name: str, option: str = "deepfake.layout") -> str:
    if name != AUTO and name not in LAYOUTS:
        raise ValueError(f"{option} {name!r} is not a deepfake layout; choose {AUTO} (detected) or one of "
                         f"{', '.join(LAYOUTS)}")
    return name


def _recorded(root: Path) -> str | None:
    """The layout a prepared tree's manifest records (`prepare` read its raw tree as it)."""
    try:
        name = json.loads((root / "manifest.json").read_text()).get("layout")
    except (OSError, ValueError, AttributeError):
        return None
    return name if name in LAYOUTS else None


def find_layout(root: Path, name: str = AUTO, what: str = "data.path", option: str = "deepfake.layout") -> Layout:
    """The layout `name` names, else the one `root` records or is detected as; a ValueError naming
    `what` (the option that gave `root`), the layouts and `option` when none matches."""
    if check_layout_name(name, option) != AUTO:
        return LAYOUTS[name]
    recorded = _recorded(root) if root.is_dir() else None
    if recorded:
        return LAYOUTS[recorded]
    for layout in LAYOUTS.values():
        if layout.detect is not None and layout.detect(root):
            return layout
    expected = "; ".join(f"{layout.title}: {layout.expects}" for layout in LAYOUTS.values())
    raise ValueError(f"{what} {str(root)!r} matches no deepfake layout: expected {expected}; or name the layout with "
                     f"{option}")


def listed_present(videos: list[Video], tree: Tree) -> tuple[list[Video], list[str]]:
    """The videos that are there, and notes: a video a file lists but the tree lacks is a ValueError
    naming the file, unless `prepare` recorded why it wrote no crops for it (left out, noted)."""
    kept, reasons = [], Counter()
    for video in videos:
        if video.listed is None or video.frames is not None or tree.has(video.key):
            kept.append(video)
            continue
        why = tree.left_out(video.key)
        if why is None:
            where, entry = video.listed
            kind = "fake" if video.label else "real"
            raise ValueError(f"{where} lists {kind} video {entry!r} but {tree.path(video.key)} does not exist")
        reasons[why.split(":")[0]] += 1
    notes = [f"{sum(reasons.values())} listed videos left out, prepare wrote no crops for them ("
             + ", ".join(f"{n} {why}" for why, n in reasons.items()) + "; manifest.json)"] if reasons else []
    return kept, notes


def split_videos(layout: Layout, listing: Listing, tree: Tree, split: str, val_fraction: float = 0.0,
                 methods: tuple[str, ...] | None = None, exclude: tuple[str, ...] = (),
                 ) -> tuple[list[Video], list[str]]:
    """Split `split`'s videos and notes. Fakes: those of `methods` (None: all) but `exclude`, each a
    family the data holds. A layout with a val split of its own gives it; without one, train and
    val are the training videos (those of split train, or of none) divided by `hold_out` on the
    video's group, `val_fraction` of them held out."""
    available = list(dict.fromkeys(v.family for v in listing.videos if v.label == 1))
    for name in (*(methods or ()), *exclude):
        if name not in available:
            raise ValueError(f"manipulation method {name!r} not under {tree.root}; methods there: {available}")
    chosen = [m for m in (methods or available) if m not in exclude]
    videos = [v for v in listing.videos if v.label == 0 or v.family in chosen]
    own_val = any(v.split == "val" for v in listing.videos)
    if split == "test" or own_val:
        videos = [v for v in videos if v.split in (split, None)]
    else:
        videos = hold_out([v for v in videos if v.split in ("train", None)], lambda v: v.group, split, val_fraction)
    notes = list(listing.notes)
    if videos and all(v.split is None for v in videos):
        where = f"no {layout.splits}" if layout.splits else f"{layout.title} has no splits"
        notes.append(f"{where}: every video is in split {split!r}")
    videos, missing = listed_present(videos, tree)
    return videos, notes + missing
