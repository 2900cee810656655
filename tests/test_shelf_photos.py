"""Synthetic shelf photos: deterministic per (seed, split, index), boxes inside the photo
and on their shelves, the plan and its violations true to what is drawn."""

import numpy as np
import pytest
from triskele.train.domains.merch.shelf_photos import FOREIGN_BASE, VIOLATIONS, render_shelf_photo

SIZE = (480, 640)


@pytest.fixture(scope="module")
def photos():
    return [render_shelf_photo(0, 2, i, SIZE, skus=100) for i in range(12)]


def test_a_photo_is_the_same_for_the_same_seed_split_and_index_and_differs_otherwise(photos):
    again = render_shelf_photo(0, 2, 3, SIZE, skus=100)
    np.testing.assert_array_equal(again.image, photos[3].image)
    np.testing.assert_array_equal(again.boxes, photos[3].boxes)
    assert again.planogram == photos[3].planogram and again.violations == photos[3].violations
    other_split = render_shelf_photo(0, 1, 3, SIZE, skus=100)
    assert other_split.planogram != photos[3].planogram


def test_boxes_lie_in_the_photo_on_their_shelves_and_their_count_is_in_range(photos):
    counts = []
    for photo in photos:
        h, w = SIZE
        b = photo.boxes
        assert photo.image.shape == (h, w, 3) and photo.image.dtype == np.float32
        assert 0 <= photo.image.min() and photo.image.max() <= 1
        assert np.all(b[:, 0] >= 0) and np.all(b[:, 2] <= w) and np.all(b[:, 1] >= 0) and np.all(b[:, 3] <= h)
        assert np.all(b[:, 2] > b[:, 0]) and np.all(b[:, 3] > b[:, 1])
        shelves = len(photo.planogram)
        assert 4 <= shelves <= 7 and set(photo.rows) <= set(range(shelves))
        pitch = h / shelves
        centre_y = (b[:, 1] + b[:, 3]) / 2
        # Each box's centre inside its shelf's band (the roll and keystone move it a few pixels).
        assert np.all(np.abs(centre_y - (photo.rows + 0.5) * pitch) < 0.5 * pitch + 0.03 * h)
        aspect = (b[:, 2] - b[:, 0]) / (b[:, 3] - b[:, 1])
        assert aspect.min() > 0.1 and aspect.max() < 9  # packages 0.4-4, stacks 2x, cut at the edges
        counts.append(len(b))
    assert 40 <= min(counts) and max(counts) <= 300, counts


def test_every_box_holds_what_its_plan_slot_and_the_violations_say(photos):
    """Each box stands in a slot of its shelf's plan (or is an extra): a slot without a violation
    holds its planned SKU, a gap no box, a foreign facing a SKU of no catalogue, a swapped slot the
    SKU planned at its partner, an extra an unplanned facing."""
    kinds = set()
    for photo in photos:
        for shelf, plan in enumerate(photo.planogram):
            assert all(0 <= s < 100 for s in plan)
            violated = {v["planned"]: v["kind"] for v in photo.violations if v["shelf"] == shelf
                        and v["kind"] != "extra"}
            extras = sum(v["kind"] == "extra" for v in photo.violations if v["shelf"] == shelf)
            here = photo.rows == shelf
            slots, skus = photo.slots[here], photo.skus[here]
            assert np.sum(slots == -1) <= extras
            for slot, sku in zip(slots, skus, strict=True):
                if slot == -1:
                    continue
                kind = violated.get(int(slot))
                kinds.add(kind)
                assert kind != "gap"
                if kind is None:
                    assert sku == plan[slot]
                elif kind == "foreign":
                    assert sku >= FOREIGN_BASE
                else:
                    assert kind == "swap" and sku != plan[slot] and sku in plan
            swaps = [v for v in photo.violations if v["shelf"] == shelf and v["kind"] == "swap"]
            assert len(swaps) % 2 == 0  # two facings exchanged each time
        kinds |= {v["kind"] for v in photo.violations}
    assert kinds >= set(VIOLATIONS) | {None}
