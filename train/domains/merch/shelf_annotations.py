"""Shelf-photo box annotations on disk: SKU-110K's CSV layout and COCO detection
JSON, read into {image name: (boxes (N, 4) x1 y1 x2 y2, SKUs or None)}.

SKU-110K: `images/` beside `annotations_{train,val,test}.csv`, rows
`image_name,x1,y1,x2,y2,class,image_width,image_height` with no header. COCO: `instances_<split>.json`
({"images": [{"id", "file_name", "width", "height"}], "annotations": [{"image_id", "bbox": [x, y,
w, h], "category_id"}], "categories": [{"id", "name"}]}), categories the SKUs where known.

A malformed row (x2 <= x1, a box outside its image, an image that is not there, a width that
disagrees with the file) is an error naming the file and the line (or annotation), or with
`skip=True` left out and counted in `problems`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
from triskele.train.data.images import image_size


@dataclasses.dataclass
class Annotations:
    boxes: dict[str, np.ndarray]
    """Image file name -> (N, 4) float32 boxes x1, y1, x2, y2 in pixels."""
    skus: dict[str, list[str | None]]
    """Image file name -> each box's SKU (None: unknown, as SKU-110K's single 'object' class)."""
    problems: list[str]
    """Each row left out with `skip=True`, with its file, line and reason."""


def _box_problem(x1: float, y1: float, x2: float, y2: float, width: int, height: int) -> str | None:
    if not all(np.isfinite(v) for v in (x1, y1, x2, y2)):
        return "a coordinate is not a finite number"
    if x2 <= x1 or y2 <= y1:
        return f"the box ({x1:g}, {y1:g}, {x2:g}, {y2:g}) has x2 <= x1 or y2 <= y1"
    if x1 < 0 or y1 < 0 or x2 > width or y2 > height:
        return f"the box ({x1:g}, {y1:g}, {x2:g}, {y2:g}) reaches outside its {width}x{height} image"
    return None


class _Collector:
    def __init__(self, images: Path, skip: bool):
        self.images, self.skip = images, skip
        self.boxes: dict[str, list[list[float]]] = {}
        self.skus: dict[str, list[str | None]] = {}
        self.problems: list[str] = []
        self._sizes: dict[str, tuple[int, int] | None] = {}

    def size_of(self, name: str) -> tuple[int, int] | None:
        if name not in self._sizes:
            path = self.images / name
            self._sizes[name] = image_size(path) if path.is_file() else None
        return self._sizes[name]

    def add(self, where: str, name: str, box: tuple[float, float, float, float], sku: str | None,
            stated: tuple[int, int] | None) -> None:
        size = self.size_of(name)
        if size is None:
            problem = f"its image {self.images / name} is not there"
        elif stated is not None and tuple(stated) != tuple(size):
            problem = f"it gives {name} as {stated[0]}x{stated[1]} pixels but the file is {size[0]}x{size[1]}"
        else:
            problem = _box_problem(*box, *size)
        if problem is not None:
            if not self.skip:
                raise ValueError(f"{where}: {problem} (data.bad_records=skip leaves such rows out and counts them)")
            self.problems.append(f"{where}: {problem}")
            return
        self.boxes.setdefault(name, []).append(list(box))
        self.skus.setdefault(name, []).append(sku)

    def result(self) -> Annotations:
        return Annotations({k: np.asarray(v, np.float32) for k, v in self.boxes.items()}, self.skus, self.problems)


def read_sku110k(root: str | Path, split: str, skip: bool = False) -> Annotations:
    """`root/annotations_<split>.csv` against `root/images/`."""
    path = Path(root) / f"annotations_{split}.csv"
    if not path.is_file():
        raise ValueError(f"SKU-110K split {split!r}: {path} is not there (expected annotations_{{train,val,test}}.csv "
                         "beside images/)")
    collector = _Collector(Path(root) / "images", skip)
    with path.open(newline="") as handle:
        for line, row in enumerate(csv.reader(handle), start=1):
            where = f"{path}:{line}"
            try:
                if len(row) != 8:
                    raise ValueError(f"it has {len(row)} fields, not 8 (image_name,x1,y1,x2,y2,class,image_width,"
                                     "image_height)")
                box = tuple(float(v) for v in row[1:5])
                stated = (int(row[6]), int(row[7]))
            except ValueError as err:
                if not skip:
                    raise ValueError(f"{where}: {err}") from None
                collector.problems.append(f"{where}: {err}")
                continue
            collector.add(where, row[0], box, None if row[5] == "object" else row[5], stated)
    return collector.result()


def read_coco(root: str | Path, split: str, skip: bool = False) -> Annotations:
    """`root/instances_<split>.json` against `root/images/`."""
    path = Path(root) / f"instances_{split}.json"
    try:
        data = json.loads(path.read_text())
        images = {int(i["id"]): (str(i["file_name"]), (int(i["width"]), int(i["height"]))) for i in data["images"]}
        names = {int(c["id"]): str(c["name"]) for c in data.get("categories", [])}
        annotations = data["annotations"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"COCO annotations {path} are not readable: {err!r}") from None
    collector = _Collector(Path(root) / "images", skip)
    for k, annotation in enumerate(annotations):
        where = f"{path}: annotation {k}"
        try:
            name, stated = images[int(annotation["image_id"])]
            x, y, w, h = (float(v) for v in annotation["bbox"])
        except (KeyError, TypeError, ValueError) as err:
            if not skip:
                raise ValueError(f"{where}: no image or bbox [x, y, w, h] ({err!r})") from None
            collector.problems.append(f"{where}: no image or bbox")
            continue
        collector.add(where, name, (x, y, x + w, y + h), names.get(annotation.get("category_id")), stated)
    return collector.result()
