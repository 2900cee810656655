import csv
import json

import jax
import numpy as np
import pytest
from PIL import Image
from trainutil import mesh_of, train_small
from triskele.eval.cli import main as eval_main
from triskele.eval.domains.merch import compliance_report
from triskele.eval.model import LiveModel
from triskele.eval.report import evaluate_checkpoint
from triskele.train.domains.merch.data import (
    EMPTY,
    GALLERY,
    QUERY,
    ProductImages,
    SyntheticRetail,
    iconic,
    inject_violations,
    make_planogram,
    read_planogram,
)
from triskele.train.domains.merch.metrics import planogram_metrics, retrieval_metrics, topk_accuracy
from triskele.train.run import restore_run


def test_generator_is_deterministic_and_splits_are_disjoint_in_skus():
    a, b = SyntheticRetail("test", 700, 32), SyntheticRetail("test", 700, 32)
    for i in (0, 300, len(a) - 1):
        np.testing.assert_array_equal(a.load(i)["image"], b.load(i)["image"])
    records = [a.load(i) for i in range(len(a))]
    queries = {int(r["label"]) for r in records if r["kind"] == QUERY}
    assert queries and min(queries) >= a.train_skus  # open-set SKUs are not training SKUs
    assert {int(r["label"]) for r in records if r["kind"] == GALLERY} == queries
    train = SyntheticRetail("train", 200, 32)
    labels = {int(train.load(i)["label"]) for i in range(200)}
    assert max(labels) == train.num_classes - 1 and all(label < train.train_skus + 1 for label in labels)


def test_nearest_neighbour_on_mean_colour_is_far_from_solving_it():
    train = SyntheticRetail("train", 3000, 32)
    test = SyntheticRetail("test", 900, 32)
    feats, labels = zip(*[(train.load(i)["image"].mean((0, 1)), int(train.load(i)["label"])) for i in range(3000)],
                        strict=True)
    feats, labels = np.array(feats), np.array(labels)
    closed = [test.load(i) for i in range(len(test)) if test.layout[i][0] == "closed"]
    queries = np.array([r["image"].mean((0, 1)) for r in closed])
    nearest = labels[np.argmin(((queries[:, None] - feats[None]) ** 2).sum(-1), axis=1)]
    top1 = float((nearest == np.array([int(r["label"]) for r in closed])).mean())
    assert top1 < 0.40, top1


def test_retrieval_and_topk_metrics_on_hand_made_embeddings():
    gallery = np.eye(3)
    gallery_labels = np.array([7, 8, 9])
    queries = np.array([[0.9, 0.1, 0], [0, 0.2, 0.9], [0.6, 0.7, 0]])
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    got = retrieval_metrics(queries, np.array([7, 9, 7]), gallery, gallery_labels)
    # Query 3 ranks label 8 first, 7 second: recall@1 2/3, AP 1, 1, 1/2.
    assert got["recall_at_1"] == pytest.approx(2 / 3)
    assert got["recall_at_5"] == 1.0
    assert got["map"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert topk_accuracy(np.array([[3, 1, 2, 0, 4], [0, 1, 2, 3, 4]]), np.array([3, 4])) == (0.5, 1.0)


def test_planogram_comparison_on_a_hand_made_shelf():
    expected = np.array(["a", "a", "b", "c"], dtype=object)
    actual = np.array(["a", EMPTY, "b", "b"], dtype=object)  # a gap and a wrong SKU
    predicted = np.array(["a", EMPTY, "c", "b"], dtype=object)  # gap and wrong SKU caught, one false alarm
    m = planogram_metrics(predicted, expected, actual, np.zeros(4))
    assert m["facing_acc"] == 0.75
    assert m["violation_precision"] == pytest.approx(2 / 3) and m["violation_recall"] == 1.0
    assert m["compliance"] == 0.25 and m["true_compliance"] == 0.5
    report = compliance_report(expected.reshape(2, 2), actual.reshape(2, 2))
    assert report["compliance"] == 0.5
    assert [(v["row"], v["col"], v["status"]) for v in report["violations"]] == [(0, 1, "gap"), (1, 1, "wrong_sku")]
    assert report["violations"][0]["found"] is None


def test_the_shelf_overlay_colours_each_status_labels_violations_and_shows_the_score():
    """Ok, wrong SKU, gap and unexpected each in its own colour with a legend,
    `expected -> found` on each violation, the compliance score in the picture."""
    from triskele.eval.domains.merch import STATUSES, legend_lines, overlay_boxes, shelf_overlay

    plan = np.array([["a", "b"], ["c", EMPTY]], dtype=object)
    report = compliance_report(plan, np.array([["a", "x"], [EMPTY, "d"]], dtype=object))
    assert report["counts"] == {"ok": 1, "wrong_sku": 1, "gap": 1, "unexpected": 1}
    boxes = overlay_boxes(report, {"left": 0, "top": 0, "width": 64, "height": 64}, scale=3)
    assert [(b["status"], b["label"]) for b in boxes] == [("ok", None), ("wrong_sku", "b -> x"),
                                                          ("gap", "c -> empty"), ("unexpected", "empty -> d")]
    assert len({b["colour"] for b in boxes}) == 4 and all(b["colour"] == STATUSES[b["status"]][0] for b in boxes)
    assert boxes[3]["box"] == (96, 96, 192, 192)
    legend = legend_lines(report)
    assert legend[0] == (None, "compliance 25% (1 of 4 facings ok)")
    assert [colour for colour, _ in legend[1:]] == [colour for colour, _ in STATUSES.values()]
    picture = shelf_overlay(Image.new("RGB", (64, 64), (128, 128, 128)), report, None)
    assert picture.width >= 192 and picture.height > 192  # facings enlarged to 96 px, the legend beneath
    for box in boxes:
        x0, y0, x1, y1 = box["box"]
        assert picture.getpixel((int(x0) + 1, int((y0 + y1) / 2))) == box["colour"]  # its outline
    for i, (colour, _) in enumerate(legend[1:]):
        assert colour in {picture.getpixel((x, y)) for x in range(40) for y in range(192, picture.height)}, i


def test_injected_violations_change_some_facings():
    rng = np.random.default_rng(0)
    plan = make_planogram(rng, 100, 3, 4)
    actual = inject_violations(plan, rng, 5, 100, rate=0.5)
    assert plan.shape == actual.shape == (3, 4)
    assert (actual != plan).any() and (actual == plan).any()


# --- on-disk layouts --------------------------------------------------------------------------


def _img(path, value=120):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((20, 16, 3), value, np.uint8)).save(path)


def write_products(root):
    for sku in ("cola", "tea"):
        for i in range(3):
            _img(root / "train" / sku / f"{i}.jpg", 40 if sku == "cola" else 200)
        _img(root / "test" / sku / "0.jpg")
    _img(root / "test" / "newjuice" / "0.jpg", 90)
    _img(root / "gallery" / "newjuice" / "ref.jpg", 90)
    _img(root / "gallery" / "cola" / "ref.jpg", 40)


def test_class_folder_layout_with_open_set_and_gallery(tmp_path):
    write_products(tmp_path)
    train = ProductImages(tmp_path, "train", 16)
    assert train.classes == ["cola", "tea"] and len(train) == 6
    test = ProductImages(tmp_path, "test", 16)
    kinds = sorted((r[3], int(r[2])) for r in test.records)
    assert kinds == [("cola", 0), ("cola", 2), ("newjuice", 1), ("newjuice", 2), ("tea", 0)]
    query = next(r for r in test.records if r[2] == QUERY)
    gallery = next(r for r in test.records if r[2] == GALLERY and r[3] == "newjuice")
    assert query[1] == gallery[1]  # one id space for queries and gallery
    assert test.load(0)["image"].shape == (16, 16, 3)


def test_grocery_store_layout_and_bad_inputs(tmp_path):
    for fine in ("Apple/Granny", "Apple/Pink", "Milk/Oat"):
        _img(tmp_path / "train" / fine / "a.jpg")
    assert ProductImages(tmp_path, "train", 16).classes == ["Apple/Granny", "Apple/Pink", "Milk/Oat"]
    (tmp_path / "train" / "Juice").mkdir()
    with pytest.raises(ValueError, match="class folder .*Juice holds no images"):
        ProductImages(tmp_path, "train", 16)
    (tmp_path / "train" / "Juice").rmdir()
    (tmp_path / "train" / "Milk" / "Oat" / "a.jpg").write_bytes(b"junk")
    files = ProductImages(tmp_path, "train", 16)
    with pytest.raises(ValueError, match="cannot read image .*Oat/a.jpg"):
        files.load(len(files) - 1)
    with pytest.raises(ValueError, match="has no test/ folder"):
        ProductImages(tmp_path, "test", 16)
    (tmp_path / "plan.json").write_text('{"rows": [["a"], ["a", "b"]]}')
    with pytest.raises(ValueError, match="plan.json is not valid"):
        read_planogram(tmp_path / "plan.json")


def test_a_planogram_of_shelves_without_a_grid(tmp_path):
    """Shelves of any length, top to bottom; malformed ones named; the gridded
    form's facing cells refuse it, naming what reads it."""
    from triskele.train.domains.merch.data import facing_boxes

    path = tmp_path / "bay.json"
    path.write_text('{"shelves": [["cola", "cola", null, 7], ["milk"]]}')
    plan = read_planogram(path)
    assert plan == {"shelves": [["cola", "cola", EMPTY, "7"], ["milk"]]}
    with pytest.raises(ValueError, match="'shelves' without a grid: finding their facings needs the facing detector"):
        facing_boxes(plan, 100, 100)
    for bad, message in [('{"shelves": []}', "'shelves' must be a non-empty list"),
                         ('{"shelves": [["a"], []]}', "'shelves' must be a non-empty list"),
                         ('{"shelves": [["a", 1.5]]}', "a SKU must be a string, an integer or null"),
                         ('{"shelf": [["a"]]}', "it must be a JSON object with 'rows' .* or with 'shelves'")]:
        path.write_text(bad)
        with pytest.raises(ValueError, match=f"planogram .*bay.json is not valid: {message}"):
            read_planogram(path)
    path.write_text(json.dumps({"shelves": [["a"] * 600, ["b"] * 600]}))
    with pytest.raises(ValueError, match="planogram_facings"):
        read_planogram(path)


# --- trained model: mesh invariance, eval, predict ---------------------------------------------

SHOP = {"data.train_size": 512, "data.eval_size": 300, "merch.num_skus": 20}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_small(tmp_path_factory.mktemp("merch"), "merch-tiny", "data=8", **SHOP, **{"run.steps": 3})


def test_embeddings_are_mesh_invariant(trained, devices):
    images = np.stack([SyntheticRetail("test", 300, 32, train_skus=20).load(i)["image"] for i in range(16)])
    out = {}
    for spec in ("data=8", "tensor=2,fsdp=4"):
        parts, state, _ = restore_run(trained, mesh_of(spec))
        out[spec] = LiveModel(parts, state.params)(images)["embedding"]
    assert out["data=8"].shape == (16, 128)
    np.testing.assert_allclose(np.linalg.norm(out["data=8"], axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(out["tensor=2,fsdp=4"], out["data=8"], atol=2e-6)
    parts, state, _ = restore_run(trained, mesh_of("tensor=2,fsdp=4"))
    assert state.params["classifier"]["kernel"].sharding.spec == jax.sharding.PartitionSpec("fsdp", None)


def test_eval_report_keys(trained, devices):
    report = evaluate_checkpoint(trained, mesh="data=2,fsdp=2,tensor=2")
    assert {"top1", "top5", "recall_at_1", "recall_at_5", "map", "facing_acc", "violation_precision",
            "violation_recall"} <= set(report["metrics"])


def test_gallery_index_crop_and_shelf_prediction(trained, tmp_path, capsys):
    synth = SyntheticRetail("test", 300, 32, train_skus=20)
    gallery_dir = tmp_path / "gallery"
    for sku in range(3):
        path = gallery_dir / f"sku{sku}" / "ref.png"
        path.parent.mkdir(parents=True)
        Image.fromarray((synth.load(len(synth) - 24 + sku)["image"] * 255).astype(np.uint8)).save(path)
    empty = gallery_dir / "empty" / "e.png"
    empty.parent.mkdir()
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(empty)
    assert eval_main(["gallery", "--workdir", str(trained), "--input", str(gallery_dir), "--mesh", "data=8"]) == 0
    assert (trained / "gallery" / "index.npz").is_file()

    inputs = tmp_path / "in"
    inputs.mkdir()
    shelf = np.concatenate([np.concatenate([np.full((32, 32, 3), 30 * (r * 2 + c), np.uint8) for c in range(2)], 1)
                            for r in range(2)], 0)
    Image.fromarray(shelf).save(inputs / "shelf.png")
    (inputs / "shelf.json").write_text(json.dumps({"rows": [["sku0", "sku1"], ["sku2", None]]}))
    Image.fromarray(np.full((32, 32, 3), 60, np.uint8)).save(inputs / "crop.png")
    out = tmp_path / "out"
    assert eval_main(["predict", "--workdir", str(trained), "--input", str(inputs), "--output", str(out),
                      "--mesh", "data=8"]) == 0, capsys.readouterr().err
    report = json.loads((out / "shelf.json").read_text())
    assert len(report["facings"]) == 4 and 0 <= report["compliance"] <= 1
    width, height = Image.open(out / "shelf.png").size
    assert width >= 192 and height > 192  # 32-pixel facings enlarged to 96, a legend beneath
    rows = list(csv.DictReader((out / "predictions.csv").open()))
    assert rows[0]["image"] == "crop.png"
    assert rows[0]["top1"] in {"sku0", "sku1", "sku2", "empty"}  # the gallery's names, nearest first
    assert len({rows[0][f"top{k}"] for k in range(1, 5)}) == 4 and rows[0]["top5"] == ""  # 4 gallery SKUs
    assert -1 <= float(rows[0]["top1_similarity"]) <= 1
    assert rows[0]["class_top1"].startswith(("sku", "empty")) and 0 < float(rows[0]["class_top1_probability"]) <= 1

    # A malformed planogram and one naming a SKU the gallery lacks are listed in
    # errors.csv with their reasons, the good shelf and the crop written, exit 1 as for a bad image.
    for name, plan in (("broken", '{"rows": [["sku0"'), ("stranger", '{"rows": [["sku0", "sku9"]]}')):
        Image.fromarray(shelf).save(inputs / f"{name}.png")
        (inputs / f"{name}.json").write_text(plan)
    out = tmp_path / "out2"
    assert eval_main(["predict", "--workdir", str(trained), "--input", str(inputs), "--output", str(out),
                      "--mesh", "data=8", "--no-progress"]) == 1, capsys.readouterr().err
    errors = {r["input"]: r["reason"] for r in csv.DictReader((out / "errors.csv").open())}
    assert set(errors) == {"broken.png", "stranger.png"}
    assert f"planogram {inputs / 'broken.json'} is not valid" in errors["broken.png"]
    assert errors["stranger.png"] == f"planogram {inputs / 'stranger.json'} names SKUs not in the gallery: ['sku9']"
    assert len(json.loads((out / "shelf.json").read_text())["facings"]) == 4 and (out / "shelf.png").is_file()
    assert not (out / "broken.json").exists() and not (out / "stranger.png").exists()
    assert [r["image"] for r in csv.DictReader((out / "predictions.csv").open())] == ["crop.png"]
    assert json.loads((out / "summary.json").read_text())["unreadable"] == 2
    # A facing detector's flag given to this recogniser's run: refused, naming it, nothing written.
    assert eval_main(["predict", "--workdir", str(trained), "--input", str(inputs), "--output", str(tmp_path / "o3"),
                      "--mesh", "data=8", "--no-progress", "--shelf-scale", "0.5"]) == 2
    assert "--shelf-scale: for a facing-detector run's shelf photos" in capsys.readouterr().err
    assert not (tmp_path / "o3").exists()


def test_a_quantized_or_exported_copy_carries_the_gallery(trained, tmp_path, capsys):
    """Predict on a quantized copy (its index rebuilt for the copy's weights from the
    recorded references) and on an export alone (the index it carries, recorded as the export's)."""
    import shutil

    from triskele.eval.domains.merch.gallery import gallery_path
    from triskele.eval.load_export import load_exported, run_files_path

    run = shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("gallery"))
    _references(tmp_path / "refs")
    assert eval_main(["gallery", "--workdir", str(run), "--input", str(tmp_path / "refs"), "--mesh", "data=8"]) == 0
    shelves = tmp_path / "in"
    _img(shelves / "shelf.png", 80)
    (shelves / "shelf.json").write_text('{"rows": [["sku0", "sku1"]]}')

    assert eval_main(["quantize", "--workdir", str(run), "--format", "int8", "--mesh", "data=8"]) == 0
    copy = tmp_path / "run-int8"
    assert gallery_path(copy).is_file()
    capsys.readouterr()
    assert eval_main(["predict", "--workdir", str(copy), "--input", str(shelves), "--output", str(tmp_path / "q"),
                      "--mesh", "data=8", "--no-progress"]) == 0, capsys.readouterr().err
    assert f"gallery index {gallery_path(copy)} rebuilt" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "q" / "shelf.json").read_text())["facings"]) == 2

    exported = tmp_path / "m.jax"
    assert eval_main(["export", "--workdir", str(run), "--output", str(exported)]) == 0
    carried = gallery_path(run_files_path(exported))
    assert json.loads(str(np.load(carried)["built_with"]))["model"] == load_exported(exported).identity
    capsys.readouterr()
    assert eval_main(["predict", "--exported", str(exported), "--input", str(shelves), "--output",
                      str(tmp_path / "e"), "--no-progress"]) == 0, capsys.readouterr().err
    assert "rebuilt" not in capsys.readouterr().out
    assert len(json.loads((tmp_path / "e" / "shelf.json").read_text())["facings"]) == 2


def _references(folder):
    synth = SyntheticRetail("test", 300, 32, train_skus=20)
    for sku in range(3):
        path = folder / f"sku{sku}" / "ref.png"
        path.parent.mkdir(parents=True)
        Image.fromarray((synth.load(len(synth) - 24 + sku)["image"] * 255).astype(np.uint8)).save(path)
    return np.stack([np.asarray(Image.open(folder / f"sku{sku}" / "ref.png"), np.float32) / 255 for sku in range(3)])


def test_a_gallery_index_is_tied_to_its_model_rebuilt_when_stale_else_refused(trained, tmp_path, capsys):
    import shutil

    from triskele.eval.domains.merch.gallery import gallery_path, refresh_gallery
    from triskele.eval.load_export import load_exported
    from triskele.train.run import restore_params

    run = shutil.copytree(trained, tmp_path / "run")
    images = _references(tmp_path / "refs")
    assert eval_main(["gallery", "--workdir", str(run), "--input", str(tmp_path / "refs"), "--mesh", "data=8"]) == 0
    index = np.load(gallery_path(run))
    built = json.loads(str(index["built_with"]))
    assert built["model"]["step"] == 3 and len(built["model"]["params_sha256"]) == 64
    assert built["preprocessing"]["image_size"] == 32 and built["preprocessing"]["channels"] == 3
    assert built["references"] == str((tmp_path / "refs").resolve())

    # Another model of the same step (other parameters): the index is rebuilt with its embeddings.
    parts, params, step = restore_params(run, mesh_of("data=8"))
    live = LiveModel(parts, params, step=step)
    other = LiveModel(parts, jax.tree.map(lambda a: a * np.float32(1.05), params), step=step)
    before = index["embeddings"]
    np.testing.assert_allclose(before, live(images)["embedding"], atol=1e-6)
    assert refresh_gallery(live, run) is None  # its own model: kept as it is
    assert refresh_gallery(other, run)["images"] == 3
    after = np.load(gallery_path(run))["embeddings"]
    np.testing.assert_allclose(after, other(images)["embedding"], atol=1e-6)
    assert np.abs(after - before).max() > 1e-3

    # An exported model: predict rebuilds the index with it, from the folder it records.
    assert eval_main(["export", "--workdir", str(run), "--output", str(tmp_path / "m.jax")]) == 0
    (tmp_path / "crops").mkdir()
    Image.fromarray(np.full((32, 32, 3), 60, np.uint8)).save(tmp_path / "crops" / "crop.png")
    capsys.readouterr()
    assert eval_main(["predict", "--exported", str(tmp_path / "m.jax"), "--workdir", str(run), "--input",
                      str(tmp_path / "crops"), "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    assert "rebuilt" in capsys.readouterr().out
    exported = load_exported(tmp_path / "m.jax")
    assert json.loads(str(np.load(gallery_path(run))["built_with"]))["model"] == exported.identity
    np.testing.assert_allclose(np.load(gallery_path(run))["embeddings"], exported(images)["embedding"], atol=1e-5)

    # The references gone: the checkpoint's predict is refused, naming both models and the rebuild.
    shutil.move(tmp_path / "refs", tmp_path / "moved")
    assert eval_main(["predict", "--workdir", str(run), "--input", str(tmp_path / "crops"), "--output",
                      str(tmp_path / "out2"), "--mesh", "data=8", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"export sha256 {exported.meta['sha256'][:12]}" in err and "checkpoint step 3 (float32" in err, err
    assert f"python -m triskele.eval gallery --workdir {run} --input" in err, err


def test_crops_listed_from_two_folders_get_a_row_each(trained, tmp_path):
    for folder, level in (("x/a", 40), ("y/b", 200)):
        (tmp_path / folder).mkdir(parents=True)
        Image.fromarray(np.full((32, 32, 3), level, np.uint8)).save(tmp_path / folder / "crop.png")
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "crops.txt").write_text("../x/a/crop.png\n../y/b/crop.png\n")
    listing = tmp_path / "lists" / "crops.txt"
    assert eval_main(["predict", "--workdir", str(trained), "--input", str(listing), "--output", str(tmp_path / "out"),
                      "--mesh", "data=8", "--no-progress"]) == 0
    rows = {r["image"]: r for r in csv.DictReader((tmp_path / "out" / "predictions.csv").open())}
    assert set(rows) == {"x/a/crop.png", "y/b/crop.png"}
    first, second = ({k: v for k, v in rows[key].items() if k != "image"} for key in rows)
    assert first != second


# --- pinned recognition and matching ----------------------------------
# The 3-step model is near chance, so these tests give it answers that are known: a classifier head
# fitted by least squares to the closed-set crops, and a gallery and shelf made of the same reference
# images. The right top-k (highest logits) then scores 1 where the lowest logits score 0, and the
# nearest gallery SKU is each facing's own where the farthest is another.


def test_nearest_shelf_gallery_sku_by_hand():
    """Facing embeddings against a shelf gallery of three SKUs and an empty facing: the nearest is
    each facing's SKU (the farthest would be another), so facing accuracy and compliance follow."""
    from triskele.train.domains.merch.data import CLOSED, FACING, SHELF_GALLERY
    from triskele.train.domains.merch.metrics import metrics, nearest_labels

    gallery = np.eye(4)  # SKUs 3, 5, 8 and EMPTY
    gallery_labels = np.array([3, 5, 8, EMPTY])
    facing = np.array([[0.8, 0.6, 0, 0], [0.1, 0.9, 0.3, 0.3], [0, 0.2, 0.1, 0.97], [0.3, 0, 0.95, 0.1]])
    facing = facing / np.linalg.norm(facing, axis=1, keepdims=True)
    np.testing.assert_array_equal(nearest_labels(facing, gallery, gallery_labels), [3, 5, EMPTY, 8])
    kinds = np.array([FACING] * 4 + [SHELF_GALLERY] * 4 + [CLOSED])
    totals = {"kind": kinds, "label": np.array([3, 5, EMPTY, 5, *gallery_labels, 3]),
              "embedding": np.concatenate([facing, gallery, gallery[:1]]),
              "expected": np.array([3, 5, 8, 5, -2, -2, -2, -2, -2]),
              "shelf": np.array([0, 0, 1, 1, -1, -1, -1, -1, -1]),
              "top5": np.array([[0, 0, 0, 0, 0]] * 8 + [[3, 1, 2, 4, 0]])}
    got = metrics(totals)
    # Found 3 5 EMPTY 8; there 3 5 EMPTY 5; planned 3 5 8 5: facings 1-3 right, the gap and the wrong
    # SKU flagged, the gap true, the wrong SKU not (a false alarm); shelf 0 compliant, shelf 1 none.
    assert (got["facing_acc"], got["violation_precision"], got["violation_recall"]) == (0.75, 0.5, 1.0)
    assert (got["compliance"], got["true_compliance"]) == (0.5, 0.75)
    assert (got["top1"], got["top5"]) == (1.0, 1.0)


def _pooled(parts, params, images):
    """The backbone's pooled features: what the classifier head sees."""
    from flax import nnx
    from triskele.models.preprocess import normalize

    def pool(params, images):
        model = nnx.merge(parts.graphdef, params)
        return model.backbone.pool(model.backbone(normalize(images, model.normalisation)))

    with jax.set_mesh(parts.mesh):
        return np.asarray(jax.jit(pool)(params, np.asarray(images, np.float32)), np.float64)


def _with_fitted_head(parts, params, images, labels, margin=8.0):
    """`params` with the classifier set by least squares so that each of `images` gets logit `margin`
    at its label and 0 at every other class (exact: fewer images than features)."""
    features = _pooled(parts, params, images)
    features = np.concatenate([features, np.ones((len(features), 1))], axis=1)
    classes = params["classifier"]["kernel"].shape[-1]
    weights = np.linalg.lstsq(features, margin * np.eye(classes)[labels], rcond=None)[0]
    head = {"kernel": weights[:-1].astype(np.float32), "bias": weights[-1].astype(np.float32)}
    placed = {k: jax.device_put(v, params["classifier"][k].sharding) for k, v in head.items()}
    return {**params, "classifier": {**params["classifier"], **placed}}


def test_a_head_that_knows_its_crops_scores_top1_one_in_evaluation_and_predict(trained, tmp_path):
    """Item 4: top-5 from the highest logits. The closed-set crops of the evaluation split (and the
    same crops saved as PNGs) get their label's logit 8 and 0 elsewhere: top-1 and top-5 are 1 with
    the highest logits, 0 with the lowest; predict's class columns name the label first."""
    from triskele.eval.domains.merch import predict_io
    from triskele.eval.engine import predict_files
    from triskele.train.data.images import read_image
    from triskele.train.domains.merch.metrics import metrics
    from triskele.train.run import evaluate_split, restore_params

    parts, params, step = restore_params(trained, mesh_of("data=8"))
    source = parts.domain.open_split(parts.config, "test")
    closed = [i for i, (part, _) in enumerate(source.layout) if part == "closed"]
    records = [source.load(i) for i in closed]
    labels = np.array([int(r["label"]) for r in records])
    assert len(closed) == 20 and len(set(labels)) >= 10
    crops = tmp_path / "crops"
    crops.mkdir()
    for i, record in enumerate(records):
        Image.fromarray((record["image"] * 255).round().astype(np.uint8)).save(crops / f"{i:02d}.png")
    saved = np.stack([read_image(crops / f"{i:02d}.png", 32, 3) for i in range(len(records))])
    images = np.concatenate([np.stack([r["image"] for r in records]), saved])
    fitted = _with_fitted_head(parts, params, images, np.concatenate([labels, labels]))

    live = LiveModel(parts, fitted, step=step)
    probabilities = live(images)["probabilities"]
    assert (probabilities.argmax(1) == np.concatenate([labels, labels])).all()  # the head is what it should be
    assert probabilities.max(1).min() > 0.99

    got = metrics(evaluate_split(parts, fitted, source))
    assert (got["top1"], got["top5"]) == (1.0, 1.0)  # lowest logits first: 0.0 and 0.0

    predict_files(live, predict_io({**live.meta, "identity": live.identity}, {}), crops, tmp_path / "out",
                  progress=False)
    rows = list(csv.DictReader((tmp_path / "out" / "predictions.csv").open()))
    names = parts.config.model.class_names
    assert [r["image"] for r in rows] == [f"{i:02d}.png" for i in range(len(records))]
    assert [r["top1"] for r in rows] == [names[label] for label in labels]
    assert all(float(r["top1_probability"]) > 0.99 for r in rows)
    assert all(len({r[f"top{k}"] for k in range(1, 6)}) == 5 for r in rows)


def test_a_gallery_of_the_shelfs_own_products_recognises_every_facing(trained, tmp_path):
    """Item 11: facings matched to the nearest gallery SKU. The gallery holds one iconic render of
    each of four SKUs and an empty shelf back; the shelf photo is those very images in a 2 x 3 grid,
    so each facing's embedding is its reference's (cosine 1): nearest gives the SKUs placed, farthest
    others. The planogram differs from the shelf at two facings (a wrong SKU and a gap)."""
    import shutil

    run = shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("gallery"))
    synth = SyntheticRetail("test", 300, 32, train_skus=20)
    skus = {"sku0": 0, "sku6": 6, "sku11": 11, "sku17": 17}
    tiles = {name: (iconic(synth.design(sku), 32) * 255).round().astype(np.uint8) for name, sku in skus.items()}
    tiles["empty"] = np.full((32, 32, 3), (150, 140, 110), np.uint8)
    tiles["empty"][28:] = (90, 84, 66)
    gallery_dir = tmp_path / "gallery"
    for name, tile in tiles.items():
        (gallery_dir / name).mkdir(parents=True)
        Image.fromarray(tile).save(gallery_dir / name / "ref.png")
    assert eval_main(["gallery", "--workdir", str(run), "--input", str(gallery_dir), "--mesh", "data=8"]) == 0

    # The 3-step model tells the references apart, though not by much: each is nearest itself.
    from triskele.eval.domains.merch.gallery import gallery_path

    with np.load(gallery_path(run)) as index:
        similarity = index["embeddings"] @ index["embeddings"].T
    off_diagonal = similarity[~np.eye(len(tiles), dtype=bool)]
    assert off_diagonal.max() < 0.99, off_diagonal.max()  # measured 0.92; itself 1.0

    on_shelf = [["sku0", "sku6", "sku11"], ["sku17", "empty", "sku6"]]
    planned = [["sku0", "sku6", "sku17"], ["sku17", "sku11", "sku6"]]
    inputs = tmp_path / "in"
    inputs.mkdir()
    Image.fromarray(np.concatenate([np.concatenate([tiles[n] for n in row], 1) for row in on_shelf], 0)).save(
        inputs / "shelf.png")
    (inputs / "shelf.json").write_text(json.dumps({"rows": planned}))
    for name in ("sku11", "empty"):
        Image.fromarray(tiles[name]).save(inputs / f"crop_{name}.png")
    out = tmp_path / "out"
    assert eval_main(["predict", "--workdir", str(run), "--input", str(inputs), "--output", str(out),
                      "--mesh", "data=8", "--no-progress"]) == 0
    report = json.loads((out / "shelf.json").read_text())
    found = [[None if n == "empty" else n for n in row] for row in on_shelf]
    assert [[f["found"] for f in report["facings"] if f["row"] == r] for r in range(2)] == found
    assert [(v["row"], v["col"], v["status"]) for v in report["violations"]] == [(0, 2, "wrong_sku"), (1, 1, "gap")]
    assert report["compliance"] == pytest.approx(4 / 6)
    rows = {r["image"]: r for r in csv.DictReader((out / "predictions.csv").open())}
    for name in ("sku11", "empty"):  # a crop of a reference: that SKU first, at cosine 1
        assert rows[f"crop_{name}.png"]["top1"] == name
        assert float(rows[f"crop_{name}.png"]["top1_similarity"]) > 0.9999
        assert len({rows[f"crop_{name}.png"][f"top{k}"] for k in range(1, 6)}) == 5
