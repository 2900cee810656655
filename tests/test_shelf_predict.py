"""Predicting shelf photos with a facing detector, piece by piece on cases
made by hand: references embedded on a canvas, tiles merged with each facing's own embedding,
facings recognised or unknown, rows judged against the plan."""

import io

import numpy as np
import pytest
from PIL import Image
from triskele.eval.domains.merch.legend import overlay_png
from triskele.eval.domains.merch.references import REFERENCE_ROWS, reference_canvas, reference_embedding
from triskele.eval.domains.merch.shelf import COLOURS, facings_of, photo_tiles, recognise, shelf_overlay
from triskele.train.domains.merch.alignment import shelf_report
from triskele.train.domains.merch.shelf_photos import render_shelf_photo
from triskele.train.domains.merch.tiles import tile_origins


def test_a_reference_becomes_rows_of_facings_of_its_own_shape():
    canvas, boxes = reference_canvas(Image.new("RGB", (30, 90), (200, 10, 10)), 128)
    assert canvas.shape == (128, 128, 3) and len(boxes) >= REFERENCE_ROWS * 4
    sides = boxes[:, 2:] - boxes[:, :2]
    np.testing.assert_allclose(sides[:, 0] / sides[:, 1], 1 / 3, rtol=0.1)  # the picture's aspect kept
    assert boxes.min() >= 0 and boxes.max() <= 128
    x1, y1, x2, y2 = boxes[0].astype(int)
    np.testing.assert_allclose(canvas[(y1 + y2) // 2, (x1 + x2) // 2], [200 / 255, 10 / 255, 10 / 255], atol=0.01)
    wide, wide_boxes = reference_canvas(Image.new("RGB", (900, 30)), 128)
    assert len(wide_boxes) >= 1 and wide_boxes[:, 2].max() <= 128


def test_a_references_embedding_is_its_copies_best_peaks_averaged():
    boxes = np.array([[0, 0, 10, 10], [20, 0, 30, 10]], np.float32)
    outputs = {"boxes": np.array([[1, 1, 9, 9], [2, 2, 8, 8], [21, 1, 29, 9], [50, 50, 60, 60]], np.float32),
               "scores": np.array([0.9, 0.95, 0.8, 0.99]),
               "embedding": np.array([[1, 0], [0, 1], [0, 1], [1, 0]], np.float32)}
    # Copy 0's best peak is peak 1 (0.95), copy 1's is peak 2; peak 3 is no copy's.
    np.testing.assert_allclose(reference_embedding(outputs, boxes), [0, 1], atol=1e-6)
    with pytest.raises(ValueError, match="finds none of its copies"):
        reference_embedding(outputs, boxes + 100)


def test_tiles_merge_back_to_each_facing_with_its_own_embedding():
    photo = render_shelf_photo(0, 2, 3, (200, 300), 100, min_facings=60, jpeg=False)
    truth = photo.boxes
    tile, overlap = 128, int(np.ceil((truth[:, 2:] - truth[:, :2]).max())) + 4
    tiles = photo_tiles(photo.image, tile, overlap)
    origins = tile_origins(200, 300, tile, overlap)
    assert tiles.shape == (len(origins), tile, tile, 3)
    np.testing.assert_array_equal(tiles[-1], photo.image[200 - tile:, 300 - tile:])
    k, identity = 400, np.eye(len(truth), dtype=np.float32)
    outputs = {"boxes": np.zeros((len(origins), k, 4), np.float32), "scores": np.zeros((len(origins), k)),
               "embedding": np.zeros((len(origins), k, len(truth)), np.float32)}
    for t, (y, x) in enumerate(origins):  # a perfect detector: what each tile sees whole or in part
        local = np.clip(truth - [x, y, x, y], 0, tile)
        seen = np.flatnonzero((local[:, 2] > local[:, 0]) & (local[:, 3] > local[:, 1]))
        outputs["boxes"][t, :len(seen)] = local[seen]
        outputs["scores"][t, :len(seen)] = 0.9
        outputs["embedding"][t, :len(seen)] = identity[seen]
    boxes, scores, embeddings = facings_of(outputs, 200, 300, tile, overlap, threshold=0.5)
    assert len(boxes) == len(truth) and np.all(scores == pytest.approx(0.9))
    ids = embeddings.argmax(1)
    assert sorted(ids) == list(range(len(truth)))  # each facing once, with its own embedding
    np.testing.assert_allclose(boxes, truth[ids], atol=1e-3)


def test_a_small_photo_is_padded_into_one_tile():
    tiles = photo_tiles(np.ones((50, 70, 3), np.float32), 128, 32)
    assert tiles.shape == (1, 128, 128, 3) and tiles[0, :50, :70].min() == 1 and tiles[0, 60, 100, 0] == 0.5


def test_facings_below_the_unknown_threshold_have_no_sku():
    gallery = (np.array([[1, 0], [0, 1]], np.float32), np.array(["cola", "soap"]))
    embeddings = np.array([[0.99, 0.14], [0.6, 0.8], [0.2, 0.98]], np.float32)
    assert recognise(embeddings, gallery, 0.9)[0] == ["cola", None, "soap"]
    assert recognise(embeddings, None, 0.9) == ([None] * 3, [None] * 3, [frozenset()] * 3)


def test_a_facing_may_be_read_as_a_sku_nearly_as_near_as_its_nearest():
    # Two references of soap (its nearer one counts), one of cola and one of tea.
    gallery = (np.array([[1, 0, 0], [0, 1, 0], [0.6, 0.8, 0], [0, 0, 1]], np.float32),
               np.array(["cola", "soap", "soap", "tea"]))
    embeddings = np.array([[0.8, 0.6, 0], [0.66, 0.0, 0.75], [0.5, 0.1, 0.0]], np.float32)
    names, cosines, accepts = recognise(embeddings, gallery, 0.55)
    # Facing 0: soap's second reference 0.96, cola 0.8: beyond PLAN_MARGIN (0.1) of soap; facing 1:
    # tea 0.75, cola 0.66 within it; facing 2: nearest cola at 0.5, below the unknown threshold.
    assert names == ["soap", "tea", None] and cosines[0] == pytest.approx(0.96)
    assert accepts == [frozenset({"soap"}), frozenset({"tea", "cola"}), frozenset()]


def test_a_planned_sku_nearly_as_near_as_the_nearest_makes_the_facing_in_place():
    boxes = np.array([[0, 0, 10, 20], [10, 0, 20, 20], [20, 0, 30, 20]], np.float32)
    plan = [["cola", "cola", "cola"]]
    report = shelf_report(boxes, np.full(3, 0.8), ["cola", "soap", "tea"], [0.9, 0.8, 0.8], plan,
                          [frozenset({"cola"}), frozenset({"soap", "cola"}), frozenset({"tea"})])
    assert [f["status"] for f in report["facings"]] == ["ok", "ok", "foreign"]
    assert report["score"] == pytest.approx(2 / 3)
    alone = shelf_report(boxes, np.full(3, 0.8), ["cola", "soap", "tea"], [0.9, 0.8, 0.8], plan)
    assert [f["status"] for f in alone["facings"]] == ["ok", "foreign", "foreign"]


def test_a_shelf_report_judges_each_facing_against_the_plan():
    # Two shelves: cola cola soap | tea (gap) tea; found: cola soap soap | tea, a gap, tea.
    boxes = np.array([[0, 0, 10, 20], [10, 0, 20, 20], [20, 0, 30, 20],
                      [0, 30, 10, 50], [20, 30, 30, 50]], np.float32)
    skus = ["cola", "soap", "soap", "tea", "tea"]
    plan = [["cola", "cola", "soap"], ["tea", "tea", "tea"]]
    report = shelf_report(boxes, np.full(5, 0.8), skus, [0.9] * 5, plan)
    assert [f["status"] for f in report["facings"]] == ["ok", "misplaced", "ok", "ok", "ok"]
    assert report["counts"]["out_of_stock"] == 1 and report["counts"]["misplaced"] == 1
    assert report["planned"] == 6 and report["score"] == pytest.approx(4 / 6)
    assert [f["row"] for f in report["facings"]] == [0, 0, 0, 1, 1]
    # The gap: the space between the teas, as tall as its row.
    assert report["gaps"] == [{"box": [10.0, 30.0, 20.0, 50.0], "row": 1, "status": "out_of_stock"}]
    bare = shelf_report(boxes, np.full(5, 0.8), skus, [0.9] * 5, None)
    assert bare["found"] == 5 and "score" not in bare and all(f["status"] is None for f in bare["facings"])
    assert "gaps" not in bare


def test_the_overlay_outlines_each_facing_in_its_status_colour_and_crosses_the_gaps():
    boxes = 5 * np.array([[0, 0, 40, 80], [40, 0, 80, 80], [120, 0, 160, 80]], np.float32)
    report = shelf_report(boxes, np.full(3, 0.8), ["cola", "soap", "cola"], [0.9] * 3, [["cola", "cola", "cola"]])
    assert [f["status"] for f in report["facings"]] == ["ok", "foreign", "ok"]  # soap is in no plan
    assert report["gaps"] == [{"box": [400.0, 0.0, 600.0, 400.0], "row": 0, "status": "out_of_stock"}]
    overlay = np.asarray(shelf_overlay(Image.new("RGB", (800, 400), (255, 255, 255)), report))
    assert overlay.shape[1] == 800 and overlay.shape[0] > 400  # the photo, the legend below it
    assert tuple(overlay[200, 0]) == COLOURS["ok"] and tuple(overlay[200, 200]) == COLOURS["foreign"]
    assert tuple(overlay[200, 500]) == COLOURS["out_of_stock"]  # the gap's cross, at its centre
    assert tuple(overlay[100, 500]) == (255, 255, 255)  # inside the gap, off the cross: the photo
    # On the photo as predict scaled it (0.5), the report's boxes (the photo's own pixels) halve.
    half = np.asarray(shelf_overlay(Image.new("RGB", (400, 200), (255, 255, 255)), report, 0.5))
    assert tuple(half[100, 0]) == COLOURS["ok"] and tuple(half[100, 100]) == COLOURS["foreign"]
    assert tuple(half[100, 250]) == COLOURS["out_of_stock"] and tuple(half[50, 250]) == (255, 255, 255)


def test_an_overlay_png_decodes_to_its_very_pixels():
    rng = np.random.default_rng(0)
    for height, width in ((1, 1), (37, 53), (283, 256)):  # random bytes: every Sub difference wraps somewhere
        pixels = rng.integers(0, 256, (height, width, 3), np.uint8)
        decoded = Image.open(io.BytesIO(overlay_png(Image.fromarray(pixels))))
        assert decoded.mode == "RGB" and decoded.size == (width, height)
        np.testing.assert_array_equal(np.asarray(decoded), pixels)
    grey = Image.new("L", (9, 4), 77)  # a picture in another mode is written as its RGB
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(overlay_png(grey)))), np.full((4, 9, 3), 77))


def test_predict_takes_a_less_certain_detection_in_a_shelf_gap_as_evaluation_does():
    # One tile, a row of 10-px facings with a space at 30; below the threshold 0.5 one detection in
    # that gap (0.4) and one over the facing at 20 (0.45): the first is a facing, the second not.
    boxes = [[x, 0, x + 10, 30] for x in (0, 10, 20, 40)] + [[30, 0, 40, 30], [21, 0, 29, 30]]
    outputs = {"boxes": np.array([boxes], np.float32), "scores": np.array([[0.9, 0.8, 0.7, 0.6, 0.4, 0.45]]),
               "embedding": np.eye(6, dtype=np.float32)[None]}
    found, scores, embeddings = facings_of(outputs, 64, 64, 64, 16, threshold=0.5)
    assert scores.tolist() == pytest.approx([0.9, 0.8, 0.7, 0.6, 0.4])  # best first
    np.testing.assert_allclose(found[-1], [30, 0, 40, 30])
    assert embeddings.argmax(1).tolist() == [0, 1, 2, 3, 4]  # each with its own embedding


def test_a_planned_facing_past_the_photos_edge_is_out_of_view_not_missing():
    # One shelf planned a a b b; the photo (50 px wide) shows a b b from x = 2: no room for a facing
    # left of the first (2 px < 0.6 x 10), so the first planned a is out of view.
    plan = [["a", "a", "b", "b"]]
    cut = np.array([[2, 0, 12, 20], [12, 0, 22, 20], [22, 0, 32, 20]], np.float32)
    report = shelf_report(cut, np.full(3, 0.8), ["a", "b", "b"], [0.9] * 3, plan, width=50)
    assert report["rows"][0]["planned"] == [None, "ok", "ok", "ok"] and report["planned"] == 3
    assert report["counts"]["missing"] == 0 and report["score"] == 1.0
    closed = shelf_report(cut, np.full(3, 0.8), ["a", "b", "b"], [0.9] * 3, plan)
    assert closed["counts"]["missing"] == 1 and closed["score"] == pytest.approx(3 / 4)
    # From x = 8 there is room for the missing a (8 px >= 6): it is missing.
    room = cut + np.array([6, 0, 6, 0], np.float32)
    assert shelf_report(room, np.full(3, 0.8), ["a", "b", "b"], [0.9] * 3, plan, width=50)["counts"]["missing"] == 1
    # The right edge alike: a a b shown up to x = 49 of 50.
    right = np.array([[19, 0, 29, 20], [29, 0, 39, 20], [39, 0, 49, 20]], np.float32)
    report = shelf_report(right, np.full(3, 0.8), ["a", "a", "b"], [0.9] * 3, plan, width=50)
    assert report["rows"][0]["planned"] == ["ok", "ok", "ok", None]
