"""A photo larger than the detector's input, detected on overlapping tiles, and
the tiles' boxes merged so that a facing cut by a tile's edge is counted once.

Tiles of `tile` pixels start every `tile - overlap` pixels (the last flush with the photo's edge).
Each tile owns a core: its area up to the middle of each overlap it shares, and keeps the boxes
whose centres lie in it. With `overlap` larger than any facing, every facing lies whole in the tile
that owns its centre, and a part cut by a tile's edge has its centre outside that tile's core (the
facing would otherwise be wider than the overlap): each facing is kept once, with no NMS.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from triskele.train.config.schema import InputLimits


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Where tiles start along one side of `length` pixels (one tile when it fits)."""
    if tile <= overlap:
        raise ValueError(f"a tile of {tile} pixels cannot overlap its neighbour by {overlap}")
    if length <= tile:
        return [0]
    stride = tile - overlap
    starts = list(range(0, length - tile, stride))
    return starts + [length - tile]


def tile_origins(height: int, width: int, tile: int, overlap: int) -> list[tuple[int, int]]:
    """(y, x) of each tile's top-left corner, row-major."""
    return [(y, x) for y in tile_starts(height, tile, overlap) for x in tile_starts(width, tile, overlap)]


def _cores(starts: list[int], tile: int, length: int) -> list[tuple[float, float]]:
    """Each tile's owned interval along one side: to the middle of each overlap with a neighbour."""
    out = []
    for k, start in enumerate(starts):
        lo = 0.0 if k == 0 else (start + starts[k - 1] + tile) / 2
        hi = float(length) if k == len(starts) - 1 else (start + tile + starts[k + 1]) / 2
        out.append((lo, hi))
    return out


def merge_tiles(detections: list[tuple[np.ndarray, np.ndarray]], height: int, width: int, tile: int,
                overlap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes (N, 4) in photo pixels, scores (N,), where each came from (N,): its index in the
    tiles' detections concatenated) from each tile's (boxes in tile pixels, scores), tiles in
    `tile_origins` order: each tile keeps the boxes it owns (see the module doc)."""
    ys, xs = tile_starts(height, tile, overlap), tile_starts(width, tile, overlap)
    y_cores, x_cores = _cores(ys, tile, height), _cores(xs, tile, width)
    kept_boxes, kept_scores, kept_index, offset = [], [], [], 0
    for (row, col), (boxes, scores) in zip([(r, c) for r in range(len(ys)) for c in range(len(xs))], detections,
                                           strict=True):
        y0, x0 = ys[row], xs[col]
        b = np.asarray(boxes, np.float64).reshape(-1, 4) + np.array([x0, y0, x0, y0])
        cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
        (ylo, yhi), (xlo, xhi) = y_cores[row], x_cores[col]
        owned = (cx >= xlo) & (cx < xhi) & (cy >= ylo) & (cy < yhi)
        kept_boxes.append(b[owned])
        kept_scores.append(np.asarray(scores, np.float64).reshape(-1)[owned])
        kept_index.append(offset + np.flatnonzero(owned))
        offset += len(b)
    return (np.concatenate(kept_boxes).astype(np.float32), np.concatenate(kept_scores).astype(np.float32),
            np.concatenate(kept_index).astype(np.int64))


def read_picture(path: Path, scale: float, limits: InputLimits) -> Image.Image:
    """The photo at `scale`, RGB."""
    from triskele.train.data.images import open_image

    image = open_image(path, limits).convert("RGB")
    if scale != 1.0:
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.BILINEAR)
    return image


def read_photo(path: Path, scale: float, limits: InputLimits) -> np.ndarray:
    """The photo at `scale`, (H, W, 3) float32 in [0, 1]."""
    return np.asarray(read_picture(path, scale, limits), np.float32) / 255.0
