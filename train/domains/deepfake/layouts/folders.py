"""Real and fake folders: the generic `[<split>/]{real,fake}/<video>` tree, and UADFV (`real/<n>.mp4`,
`fake/<n>_fake.mp4`, no splits), whose fakes are named after their real."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from triskele.train.data.splits import SPLITS
from triskele.train.domains.deepfake.layouts.base import Layout, Listing, Tree, Video

KINDS = (("real", 0), ("fake", 1))


def _folders(tree: Tree, group: Callable[[str], str]) -> Listing:
    """`<split>/real`, `<split>/fake` of each split folder holding a `real/`, and `real/`, `fake/` at
    the root (in every split)."""
    bases = [(f"{split}/", split) for split in SPLITS if (tree.root / split / "real").is_dir()]
    bases += [("", None)] if (tree.root / "real").is_dir() else []
    videos = []
    for prefix, split in bases:
        for kind, label in KINDS:
            for key in tree.videos(prefix + kind):
                name = key.rsplit("/", 1)[1]
                videos.append(Video(f"{kind}/{name}", key, label, split, kind, group(name)))
    return Listing(videos)


def read_generic(tree: Tree, compression: str | None) -> Listing:
    return _folders(tree, lambda name: name)


def read_uadfv(tree: Tree, compression: str | None) -> Listing:
    return _folders(tree, lambda name: name.removesuffix("_fake"))


def _is_uadfv(root: Path) -> bool:
    if not ((root / "real").is_dir() and (root / "fake").is_dir()) or any((root / s).is_dir() for s in SPLITS):
        return False
    fakes = [p.name for p in (root / "fake").iterdir()]
    return bool(fakes) and all(Path(name).stem.endswith("_fake") for name in fakes)


GENERIC = Layout(
    name="generic", title="generic", read=read_generic,
    expects="[<split>/]real/ and fake/ folders of videos",
    detect=lambda root: any((root / prefix / "real").is_dir() for prefix in ("", *SPLITS)),
    splits="train/, val/ or test/ folder",
)
UADFV = Layout(
    name="uadfv", title="UADFV", read=read_uadfv, expects="real/<n>.mp4 and fake/<n>_fake.mp4", detect=_is_uadfv,
)
