"""The Deepfake Detection Challenge (DFDC): the test set `test/labels.csv` (columns filename, label;
1 = fake) beside its videos (`test/` or `test/videos/`), and the training parts
`train/dfdc_train_part_<n>/metadata.json` (file -> {"label": "REAL" or "FAKE", "original": the real
a fake was made from}) beside theirs."""

from __future__ import annotations

import csv
from pathlib import Path, PurePosixPath

from triskele.train.data.splits import dataset_name
from triskele.train.domains.deepfake.layouts.base import Layout, Listing, Tree, Video, entries_of

LABELS = "test/labels.csv"
FAMILY = "DFDC"


def _stem(name: str) -> str:
    return str(PurePosixPath(name).with_suffix(""))


def _test(tree: Tree, labels: Path) -> list[Video]:
    videos = []
    with labels.open(newline="", errors="replace") as file:
        reader = csv.DictReader(file)
        if not {"filename", "label"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{labels}: columns {reader.fieldnames} lack filename and label (DFDC's test labels: "
                             "filename,label with 1 = fake)")
        for row in reader:
            where = f"{labels} line {reader.line_num}"
            name, label = (row["filename"] or "").strip(), (row["label"] or "").strip()
            if label not in ("0", "1"):
                raise ValueError(f"{where}: label {label!r} for {name!r}; DFDC's test labels are 1 (fake) and 0 (real)")
            stem = _stem(dataset_name(name, labels, f"line {reader.line_num}"))
            key = tree.first(f"test/{stem}", f"test/videos/{stem}")
            videos.append(Video(key, key, int(label), "test", FAMILY if label == "1" else "real", stem,
                                (where, name)))
    return videos


def _part(part: str, metadata: Path) -> list[Video]:
    entries = entries_of(metadata, "DFDC's metadata (file -> {\"label\": \"REAL\" or \"FAKE\"})")
    videos = []
    for name, entry in entries.items():
        label = entry.get("label")
        if label not in ("REAL", "FAKE"):
            raise ValueError(f"{metadata}, {name!r}: label {label!r}; DFDC's labels are REAL and FAKE")
        key = f"{part}/{_stem(dataset_name(name, metadata, repr(name)))}"
        original = entry.get("original") if label == "FAKE" else None
        group = _stem(str(original)) if original else _stem(name)
        videos.append(Video(key, key, int(label == "FAKE"), "train", FAMILY if label == "FAKE" else "real",
                            f"{part}/{group}", (str(metadata), name)))
    return videos


def _parts(root: Path) -> list[str]:
    return sorted(p.parent.relative_to(root).as_posix() for pattern in ("train/dfdc_train_part_*/metadata.json",
                                                                        "dfdc_train_part_*/metadata.json")
                  for p in root.glob(pattern))


def read_dfdc(tree: Tree, compression: str | None) -> Listing:
    labels = tree.root / LABELS
    videos = _test(tree, labels) if labels.is_file() else []
    parts = _parts(tree.root)
    for part in parts:
        videos += _part(part, tree.root / part / "metadata.json")
    files = ([labels] if labels.is_file() else []) + [tree.root / part / "metadata.json" for part in parts]
    return Listing(videos, files=files)


DFDC = Layout(
    name="dfdc", title="DFDC", read=read_dfdc,
    expects=f"{LABELS} and test videos, or train/dfdc_train_part_<n>/metadata.json and their videos (DFDC)",
    detect=lambda root: (root / LABELS).is_file() or bool(_parts(root)), splits=LABELS,
)
