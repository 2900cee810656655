"""Large shelf photos on overlapping tiles: a 1600 x 1200 synthetic photo of over
250 facings, "detected" tile by tile as a perfect detector would see each tile (every facing's part
inside it, cut at its edges), merges back to every facing exactly once, none twice at the seams."""

import numpy as np
import pytest
from triskele.train.domains.merch.shelf_photos import render_shelf_photo
from triskele.train.domains.merch.tiles import merge_tiles, tile_origins, tile_starts


def test_tiles_cover_the_photo_and_the_last_is_flush_with_its_edge():
    assert tile_starts(1600, 512, 128) == [0, 384, 768, 1088]
    assert tile_starts(300, 512, 128) == [0]
    assert len(tile_origins(1200, 1600, 512, 128)) == 3 * 4
    with pytest.raises(ValueError, match="a tile of 128 pixels cannot overlap its neighbour by 128"):
        tile_starts(1600, 128, 128)


def seen_by(boxes: np.ndarray, y0: int, x0: int, tile: int) -> np.ndarray:
    """The parts of `boxes` inside the tile at (y0, x0), in tile pixels (what a perfect detector gives)."""
    clipped = np.stack([np.clip(boxes[:, 0] - x0, 0, tile), np.clip(boxes[:, 1] - y0, 0, tile),
                        np.clip(boxes[:, 2] - x0, 0, tile), np.clip(boxes[:, 3] - y0, 0, tile)], axis=1)
    return clipped[(clipped[:, 2] - clipped[:, 0] > 0.5) & (clipped[:, 3] - clipped[:, 1] > 0.5)]


def test_facings_straddling_the_seams_are_counted_once():
    photo = render_shelf_photo(0, 2, 0, (1200, 1600), 100, min_facings=260, jpeg=False)
    truth = photo.boxes
    assert len(truth) >= 250
    tile = 512
    overlap = int(np.ceil(max((truth[:, 2:] - truth[:, :2]).max(), 1))) + 8  # larger than any facing
    origins = tile_origins(1200, 1600, tile, overlap)
    per_tile = [seen_by(truth, y, x, tile) for y, x in origins]
    cut = sum(len(t) for t in per_tile) - len(truth)
    assert cut > 50  # many facings are seen by two or four tiles, whole or cut
    boxes, scores, index = merge_tiles([(t, np.ones(len(t))) for t in per_tile], 1200, 1600, tile, overlap)
    assert len(boxes) == len(truth) and len(scores) == len(truth)
    order = lambda b: b[np.lexsort((b[:, 1], b[:, 0]))]
    np.testing.assert_allclose(order(boxes), order(truth), atol=1e-3)
    # Each kept box's index finds it among the tiles' detections (shifted by its tile's origin).
    flat = np.concatenate([t + np.array([x, y, x, y]) for t, (y, x) in zip(per_tile, origins, strict=True)])
    np.testing.assert_allclose(flat[index], boxes, atol=1e-3)
    # Kept from every tile that sees them, the facings at the seams would count twice.
    naive = sum(len(t) for t in per_tile)
    assert naive > 1.1 * len(truth)
