"""The DFDC preview (DFDCP): `dataset.json` maps each video's path (`original_videos/<id>/...mp4`,
`method_A/<id>/...mp4`, `method_B/...`) to {"label": "real" or "fake", "set": "train" or "test"}."""

from __future__ import annotations

from pathlib import PurePosixPath

from triskele.train.data.splits import dataset_name
from triskele.train.domains.deepfake.layouts.base import Layout, Listing, Tree, Video, entries_of

INDEX = "dataset.json"


def read_dfdcp(tree: Tree, compression: str | None) -> Listing:
    index = tree.root / INDEX
    entries = entries_of(index, "DFDCP's index (path -> {\"label\": \"real\" or \"fake\", \"set\": \"train\" or "
                                "\"test\"})")
    videos = []
    for name, entry in entries.items():
        label, split = entry.get("label"), entry.get("set")
        if label not in ("real", "fake"):
            raise ValueError(f"{index}, {name!r}: label {label!r}; DFDCP's labels are real and fake")
        if split not in ("train", "test"):
            raise ValueError(f"{index}, {name!r}: set {split!r}; DFDCP's sets are train and test")
        path = PurePosixPath(dataset_name(name, index, repr(name)))
        key = str(path.with_suffix(""))
        group = path.parts[1] if len(path.parts) > 2 else path.stem  # the filmed person's folder
        videos.append(Video(key, key, int(label == "fake"), split, path.parts[0] if label == "fake" else "real",
                            group, (str(index), name)))
    return Listing(videos, files=[index])


DFDCP = Layout(
    name="dfdcp", title="DFDCP", read=read_dfdcp,
    expects=f"{INDEX} and original_videos/, method_A/, method_B/ (the DFDC preview)",
    detect=lambda root: (root / INDEX).is_file(), splits=INDEX,
)
