"""Celeb-DF (v1 and v2): `Celeb-real/`, `YouTube-real/` and `Celeb-synthesis/` folders of videos and
`List_of_testing_videos.txt`, whose lines are `<label> <folder>/<video>.mp4` with label 1 = real,
0 = fake (the opposite of ours). The listed videos are the test split; the others are training's."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from triskele.train.data.splits import dataset_name
from triskele.train.domains.deepfake.layouts.base import Layout, Listing, Tree, Video

REAL_FOLDERS = ("Celeb-real", "YouTube-real")
FAKE_FOLDER = "Celeb-synthesis"
TEST_LIST = "List_of_testing_videos.txt"


def _group(key: str) -> str:
    """A face and its fakes: `Celeb-real/id0_0000` and `Celeb-synthesis/id0_id16_0000` are id0's."""
    folder, name = key.split("/", 1)
    return f"youtube-{name}" if folder == "YouTube-real" else name.split("_")[0]


def _video(key: str, split: str | None, listed: tuple[str, str] | None = None) -> Video:
    fake = key.startswith(f"{FAKE_FOLDER}/")
    return Video(key, key, int(fake), split, FAKE_FOLDER if fake else "real", _group(key), listed)


def _listed(test_list: Path) -> list[Video]:
    videos: dict[str, Video] = {}
    for number, line in enumerate(test_list.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{test_list} line {number}"
        fields = line.split()
        if len(fields) != 2 or fields[0] not in ("0", "1"):
            raise ValueError(f"{where}: {line.strip()!r} is not '<label> <folder>/<video>.mp4' with label 1 "
                             "(real) or 0 (fake)")
        path = PurePosixPath(dataset_name(fields[1], test_list, f"line {number}"))
        folder = path.parts[0] if len(path.parts) > 1 else ""
        if folder not in (*REAL_FOLDERS, FAKE_FOLDER):
            raise ValueError(f"{where}: {fields[1]!r} is not in {', '.join(REAL_FOLDERS)} or {FAKE_FOLDER}/")
        video = _video(str(path.with_suffix("")), "test", (where, fields[1]))
        if video.label != 1 - int(fields[0]):
            says, kind = ("real", "fake") if fields[0] == "1" else ("fake", "real")
            raise ValueError(f"{where}: label {fields[0]} ({says}) for {fields[1]!r}, a video of the {kind} "
                             f"folder {folder}/")
        videos.setdefault(video.key, video)  # a line given twice lists one video
    return list(videos.values())


def read_celebdf(tree: Tree, compression: str | None) -> Listing:
    test_list = tree.root / TEST_LIST
    listed = _listed(test_list) if test_list.is_file() else []
    tested = {v.key for v in listed}
    split = "train" if test_list.is_file() else None
    found = [_video(key, split) for folder in (*REAL_FOLDERS, FAKE_FOLDER) for key in tree.videos(folder)
             if key not in tested]
    return Listing(found + listed, files=[test_list] if test_list.is_file() else [])


CELEB_DF = Layout(
    name="celeb-df", title="Celeb-DF", read=read_celebdf,
    expects=f"{', '.join(REAL_FOLDERS)}, {FAKE_FOLDER}/ and {TEST_LIST} (Celeb-DF v1/v2)",
    detect=lambda root: (root / TEST_LIST).is_file() or (root / FAKE_FOLDER).is_dir(), splits=TEST_LIST,
)
