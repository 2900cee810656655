"""FaceForensics++: `original_sequences/youtube/<c>/videos/<vid>.mp4` (real),
`manipulated_sequences/<Method>/<c>/videos/<a>_<b>.mp4` (fake) and the official
`splits/{train,val,test}.json` (pairs [a, b]: reals a and b, fakes a_b and b_a)."""

from __future__ import annotations

import json
from pathlib import Path

from triskele.train.data.splits import SPLITS, dataset_name
from triskele.train.domains.deepfake.layouts.base import Layout, Listing, Tree, Video

REALS = "original_sequences/youtube"
FAKES = "manipulated_sequences"


def _pairs(split_file: Path) -> list[tuple[str, str]]:
    try:
        pairs = [(str(a), str(b)) for a, b in json.loads(split_file.read_text())]
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        raise ValueError(f"split file {split_file} is not a JSON list of [a, b] pairs: {err}") from None
    for number, pair in enumerate(pairs, 1):
        for name in pair:
            dataset_name(name, split_file, f"entry {number} {json.dumps(list(pair))}")
    return pairs


def _compressions(tree: Tree, compression: str | None) -> list[str]:
    if compression is not None:
        return [compression]
    folders = (REALS, *(f"{FAKES}/{method}" for method in tree.folders(FAKES)))
    return sorted({c for folder in folders for c in tree.folders(folder)})


def read_ffpp(tree: Tree, compression: str | None) -> Listing:
    """Every split file's videos (a video two files list is in both splits), or, without split
    files, every video in every split."""
    methods = tree.folders(FAKES)
    compressions = _compressions(tree, compression)
    if compression is not None:
        real_dir = tree.where(f"{REALS}/{compression}/videos")
        if not real_dir.is_dir():
            raise ValueError(f"FaceForensics++ layout at {tree.root}: missing folder {real_dir}")
    split_files = [tree.root / "splits" / f"{split}.json" for split in SPLITS]
    present = [f for f in split_files if f.is_file()]
    videos: list[Video] = []
    if not present:
        for c in compressions:
            for key in tree.videos(f"{REALS}/{c}/videos"):
                vid = key.rsplit("/", 1)[1]
                videos.append(Video(f"original/{vid}", key, 0, None, "real", vid))
            for method in methods:
                for key in tree.videos(f"{FAKES}/{method}/{c}/videos"):
                    vid = key.rsplit("/", 1)[1]
                    videos.append(Video(f"{method}/{vid}", key, 1, None, method, vid.split("_")[0]))
        return Listing(videos)

    def held(folder: str) -> bool:
        """Every compression (prepare) reads the folders there are; the one asked for, each method's
        (a listed video missing from it is an error)."""
        return compression is not None or tree.where(folder).is_dir()

    for split_file in present:
        split, pairs = split_file.stem, _pairs(split_file)
        where = f"split file {split_file}"
        group = {v: f"{a}_{b}" for a, b in pairs for v in (a, b)}
        reals = sorted(group)
        fakes = sorted({f"{a}_{b}" for a, b in pairs} | {f"{b}_{a}" for a, b in pairs})
        for c in compressions:
            if held(f"{REALS}/{c}/videos"):
                videos += [Video(f"original/{vid}", f"{REALS}/{c}/videos/{vid}", 0, split, "real", group[vid],
                                 (where, vid)) for vid in reals]
            videos += [Video(f"{method}/{vid}", f"{FAKES}/{method}/{c}/videos/{vid}", 1, split, method,
                             group[vid.split("_")[0]], (where, vid))
                       for method in methods if held(f"{FAKES}/{method}/{c}/videos") for vid in fakes]
    # a method none of whose videos the pairs name (DeepFakeDetection's actors' clips) is not FF++'s pairs
    unnamed = [m for m in methods if not any(tree.has(v.key) for v in videos if v.family == m)]
    notes = [f"{', '.join(unnamed)}: no video named as the split files' pairs are, left out"] if unnamed else []
    return Listing([v for v in videos if v.family not in unnamed], notes, sorted((tree.root / "splits").glob("*.json")))


FFPP = Layout(
    name="ffpp", title="FaceForensics++", read=read_ffpp,
    expects="original_sequences/youtube/<c>/videos/*.mp4, manipulated_sequences/<Method>/<c>/videos/*.mp4 "
            "and splits/{train,val,test}.json",
    detect=lambda root: (root / "original_sequences").is_dir(), splits="splits/{train,val,test}.json",
)
