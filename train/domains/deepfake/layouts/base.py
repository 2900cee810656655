"""What every deepfake dataset layout gives: its videos as rows (where the video lies, its label,
its split, its family), read from a tree of raw videos (`prepare deepfake`'s input) or of the face
frames `prepare` made from them (what `--data` reads)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from triskele.train.domains.deepfake.video import VIDEO_SUFFIXES


class Video(NamedTuple):
    """One video of a dataset (one split's: a video two splits list is two rows)."""

    name: str
    """Unique in the dataset and shown in reports (`Celeb-real/id0_0000`, FaceForensics++'s
    `Deepfakes/000_003`)."""
    key: str
    """Where it lies: its path under the dataset's root without the suffix (`Celeb-real/id0_0000`);
    prepared, the folder of its crops (`Tree.path`)."""
    label: int
    """0 real, 1 fake."""
    split: str | None
    """train, val or test; None: the layout gives no split, the video is in every one."""
    family: str
    """`real`, or the manipulation method of a fake (FaceForensics++'s `Deepfakes`, Celeb-DF's
    `Celeb-synthesis`): the cross-manipulation table's columns."""
    group: str
    """Videos of one group (a face and its fakes) are held out for val together."""
    listed: tuple[str, str] | None = None
    """(the file that lists it, as it lists it), for a video a label or split file names: missing,
    it is an error naming the file. None: found by listing a folder."""
    frames: tuple[Path, ...] | None = None
    """Its frames, where the layout lists them (DeepfakeBench's JSON); None: the files of its folder."""


@dataclass
class Listing:
    """What a layout reader gives: the rows, notes for the report, and the label and split files it
    read (which `prepare` copies beside the frames, so that the prepared tree reads as the raw one)."""

    videos: list[Video]
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def entries_of(index: Path, what: str) -> dict[str, dict]:
    """A JSON index of `name -> {...}` objects (DFDC's metadata, DFDCP's dataset.json); anything
    else is an error naming the file and `what` it should be."""
    try:
        entries = json.loads(index.read_text())
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise ValueError("not an object of name -> object")
    except ValueError as err:
        raise ValueError(f"{index} is not {what}: {err}") from None
    return entries


def frames_key(key: str) -> str:
    """A video's key -> its prepared folder's path under the output: each `videos` folder becomes
    `frames` (FaceForensics++'s `.../c23/videos/000` -> `.../c23/frames/000`)."""
    return "/".join("frames" if part == "videos" else part for part in PurePosixPath(key).parts)


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


class Tree:
    """A dataset's root seen as raw videos (`prepared` False: each video a file `<key>.<suffix>`) or
    as `prepare`'s output (each video a folder `frames_key(key)` of face crops, and `manifest.json`
    saying why a video has none)."""

    def __init__(self, root: Path, prepared: bool):
        self.root, self.prepared = Path(root), prepared
        self._entries: dict[str, dict[str, Path]] = {}
        self._manifest: dict[str, str] | None = None

    def folders(self, folder: str) -> list[str]:
        """The names of the folders in `folder` (methods, compression levels, training parts)."""
        path = self.root / folder
        return sorted(p.name for p in path.iterdir() if p.is_dir()) if path.is_dir() else []

    def where(self, folder: str) -> Path:
        """Where the videos of `folder` (a key's parent) lie: the folder, or prepared, its frames'."""
        return self.root / frames_key(folder) if self.prepared else self.root / folder

    def entries(self, folder: str) -> dict[str, Path]:
        """Name -> location of each video directly in `folder` (a key's parent), sorted by name."""
        if folder not in self._entries:
            where = self.where(folder)
            found: dict[str, Path] = {}
            if where.is_dir():
                for path in sorted(where.iterdir()):
                    if self.prepared and path.is_dir():
                        found[path.name] = path
                    elif not self.prepared and path.suffix.lower() in VIDEO_SUFFIXES and path.is_file():
                        found.setdefault(path.stem, path)
            self._entries[folder] = found
        return self._entries[folder]

    def videos(self, folder: str) -> list[str]:
        """The keys of the videos directly in `folder`."""
        return [_join(folder, name) for name in self.entries(folder)]

    def _parts(self, key: str) -> tuple[str, str]:
        path = PurePosixPath(key)
        return ("" if str(path.parent) == "." else str(path.parent)), path.name

    def has(self, key: str) -> bool:
        folder, name = self._parts(key)
        return name in self.entries(folder)

    def path(self, key: str) -> Path:
        """The video's file (raw) or its folder of crops (prepared); where it would be if missing."""
        folder, name = self._parts(key)
        found = self.entries(folder).get(name)
        if found is not None:
            return found
        return self.where(folder) / name if self.prepared else self.where(folder) / f"{name}.mp4"

    def first(self, *keys: str) -> str:
        """The first of `keys` that is present (a layout that allows a video in more than one
        place), else the first."""
        return next((key for key in keys if self.has(key)), keys[0])

    def left_out(self, key: str) -> str | None:
        """Why `prepare` wrote no crops for the video (its manifest's reason: no face, unreadable),
        or None when the manifest does not list it so (or this is not a prepared tree)."""
        if not self.prepared:
            return None
        if self._manifest is None:
            self._manifest = {}
            try:
                entries = json.loads((self.root / "manifest.json").read_text())["videos"]
            except (OSError, ValueError, KeyError, TypeError):
                entries = []
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, dict) and not entry.get("frames") and isinstance(entry.get("video"), str):
                    why = entry.get("error") or entry.get("reason") or "no face crops written"
                    self._manifest[str(PurePosixPath(entry["video"]).with_suffix(""))] = str(why)
        return self._manifest.get(key)


@dataclass(frozen=True)
class Layout:
    """One dataset layout: how it is recognised, what it looks like, how its rows are read."""

    name: str
    """As `--layout` and `deepfake.layout` name it."""
    title: str
    """As reports name it (`FaceForensics++`)."""
    expects: str
    """What a tree of it holds, in words (errors and `--help` say it)."""
    read: Callable[[Tree, str | None], Listing]
    """(tree, compression: FaceForensics++'s folder, None for every one) -> the listing; a label or
    split file that contradicts the layout is a ValueError naming the file (and line)."""
    detect: Callable[[Path], bool] | None = None
    """Whether a root is of this layout (None: only when named)."""
    splits: str = ""
    """Where the layout's splits come from, in words (for the note when a tree has none)."""
    frames_only: bool = False
    """It lists face crops already made (no videos for `prepare`)."""
