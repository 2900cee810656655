"""Shelf photos on disk as the facing detector's records: SKU-110K's CSV or COCO JSON beside
`images/` (`shelf_annotations`), each photo resized by `merch.shelf_scale` and cut into the tiles
predict cuts it into (`tiles`), a tile one record holding the boxes whose centres lie in it, clipped
to it. So the detector trains and is evaluated on products as large in pixels as it will predict.

SKUs: COCO's categories, in the order of their names in the training split's file, are the
recognition head's classes (`merch.num_skus` must hold them); SKU-110K names none (detection only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from triskele.train.config.schema import InputLimits
from triskele.train.data.images import image_size
from triskele.train.domains.merch.shelf_annotations import Annotations, read_coco, read_sku110k
from triskele.train.domains.merch.shelf_photos import detector_record
from triskele.train.domains.merch.tiles import read_photo, tile_origins

MIN_VISIBLE = 0.5
"""A box cut by its tile's edge is kept while this share of its area is in the tile."""


def read_layout(root: Path, split: str, skip: bool) -> Annotations:
    """The split's annotations in whichever layout `root` holds; ValueError naming both when neither."""
    if (root / f"annotations_{split}.csv").is_file():
        return read_sku110k(root, split, skip)
    if (root / f"instances_{split}.json").is_file():
        return read_coco(root, split, skip)
    raise ValueError(f"data.path {root} holds no shelf annotations for split {split!r}: expected SKU-110K's "
                     f"annotations_{split}.csv or COCO's instances_{split}.json beside images/")


class ShelfPhotoFiles:
    """Detector records (`detector_record`) of the tiles of the annotated photos of one split."""

    def __init__(self, root: str | Path, split: str, tile: int, *, scale: float = 1.0, overlap: int = 32,
                 max_boxes: int = 1024, num_skus: int = 0, skip: bool = False, limits: InputLimits | None = None):
        self.root, self.split, self.tile, self.scale = Path(root), split, tile, scale
        self.overlap, self.max_boxes, self.limits = overlap, max_boxes, limits or InputLimits()
        self.annotations = read_layout(self.root, split, skip)
        train = self.annotations if split == "train" else read_layout(self.root, "train", skip)
        self.catalogue = sorted({s for skus in train.skus.values() for s in skus if s is not None})
        if len(self.catalogue) > num_skus and num_skus:
            raise ValueError(f"merch.num_skus={num_skus} is fewer than the {len(self.catalogue)} SKUs the training "
                             f"annotations in {self.root} name; set merch.num_skus={len(self.catalogue)}")
        self.index = {name: i for i, name in enumerate(self.catalogue)}
        self.tiles = []
        for name in sorted(self.annotations.boxes):
            width, height = image_size(self.root / "images" / name, self.limits)
            scaled = (max(round(height * scale), tile), max(round(width * scale), tile))
            self.tiles += [(name, y, x) for y, x in tile_origins(*scaled, tile, overlap)]

    def __len__(self) -> int:
        return len(self.tiles)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        name, y, x = self.tiles[index]
        photo = read_photo(self.root / "images" / name, self.scale, self.limits)
        canvas = np.full((max(photo.shape[0], self.tile), max(photo.shape[1], self.tile), 3), 0.5, np.float32)
        canvas[: photo.shape[0], : photo.shape[1]] = photo
        boxes = self.annotations.boxes[name] * self.scale - np.array([x, y, x, y], np.float32)
        clipped = np.clip(boxes, 0, self.tile)
        area = lambda b: np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
        keep = area(clipped) >= MIN_VISIBLE * np.maximum(area(boxes), 1e-9)
        skus = np.array([self.index.get(s, -1) if s is not None else -1 for s in self.annotations.skus[name]],
                        np.int32)
        return detector_record(canvas[y : y + self.tile, x : x + self.tile], clipped[keep], self.max_boxes,
                               f"{self.root / 'images' / name} tile at ({x}, {y})", skus[keep])
