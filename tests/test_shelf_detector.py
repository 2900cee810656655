"""The merch-shelf preset: the facing detector trains through the shared engine on
synthetic shelf photos, the same numbers on one device and on a sharded mesh, its loss falling, and
its evaluation scores detections with COCO's evaluator."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from trainutil import mesh_of, small_config, step_records
from triskele.eval.cli import main as eval_main
from triskele.eval.export import export_model
from triskele.train import make_config, train
from triskele.train.cli import main as train_main
from triskele.train.domains.merch.alignment import GAP_FILL
from triskele.train.domains.merch.shelf_photos import ShelfPhoto, package_render, render_shelf_photo
from triskele.train.run import evaluate_split, restore_params

pytestmark = pytest.mark.xdist_group("shelf_detector")  # module fixtures shared: one worker runs them

SHELF = {"model.image_size": 64, "model.patch": 8, "merch.min_facings": 12, "merch.max_boxes": 160,
         "merch.max_detections": 200, "data.global_batch": 8, "data.train_size": 64,
         "data.eval_size": 8, "optim.lr": 2e-3}


def shelf_config(**overrides):
    return small_config("merch-shelf-tiny", **{**SHELF, **overrides})


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("shelf") / "single"
    train(shelf_config(**{"run.steps": 4}), workdir, mesh=mesh_of("single"), progress=False)
    return step_records(workdir)


@pytest.mark.parametrize("spec", ["data=8", "data=2,fsdp=2,tensor=2"])
def test_the_detector_trains_the_same_on_one_device_and_sharded(spec, single, tmp_path, devices):
    train(shelf_config(**{"run.steps": 4}), tmp_path, mesh=mesh_of(spec), progress=False)
    records = step_records(tmp_path)
    for step, reference in single.items():
        for key in ("loss", "grad_norm"):
            assert records[step][key] == pytest.approx(reference[key], rel=1e-4), (step, key)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The detector trained for 40 steps on 8 devices, evaluated on val at the end."""
    workdir = tmp_path_factory.mktemp("shelf") / "run"
    train(shelf_config(**{"run.steps": 40, "run.eval_every": 40}), workdir, mesh=mesh_of("data=8"), progress=False)
    return workdir


def test_the_loss_falls_and_evaluation_scores_the_detections(trained, devices):
    workdir = trained
    records = step_records(workdir)
    first, last = np.mean([records[s]["loss"] for s in (1, 2, 3)]), np.mean([records[s]["loss"] for s in (38, 39, 40)])
    assert last < 0.7 * first, (first, last)
    parts, params, _ = restore_params(workdir, mesh_of("data=8"))
    source = parts.domain.open_split(parts.config, "test")
    evaluator = parts.domain.evaluator(parts, False)
    totals = evaluator.accumulate(params, source)
    assert totals["boxes"].shape == (8, 200, 4) and totals["true_boxes"].shape == (8, 160, 4)
    got = evaluator.metrics(totals)
    assert set(got) == {"ap", "ap50", "ap75", "ar300", "count_mae", "count_error", "score_threshold", "detection_f1",
                        "sku_top1", "open_set_accuracy", "unknown_threshold", "f1_ok", "f1_misplaced", "f1_foreign",
                        "f1_out_of_stock", "f1_missing", "score_mae"}
    assert all(0 <= got[k] <= 1 for k in ("f1_ok", "f1_misplaced", "f1_foreign", "f1_out_of_stock", "score_mae"))
    assert 0 <= got["sku_top1"] <= 1 and 0 <= got["open_set_accuracy"] <= 1
    assert all(0 <= got[k] <= 1 for k in ("ap", "ap50", "ap75", "ar300")) and got["ap50"] >= got["ap75"]
    # The same scores from pycocotools straight on the truth the photos were drawn with.
    truth = [source.photo(i).boxes for i in range(len(source))]
    for i, t in enumerate(truth):
        np.testing.assert_allclose(totals["true_boxes"][i][totals["box_valid"][i] > 0], t)
        skus = source.photo(i).skus
        np.testing.assert_array_equal(totals["true_skus"][i][: len(t)], np.where(skus >= 1_000_000, -1, skus))
    assert totals["sku"].shape == totals["sku_cosine"].shape == (8, 200)
    assert evaluate_split(parts, params, source).keys() >= {"boxes", "scores"}


def test_the_thresholds_chosen_on_val_are_saved_with_the_checkpoint_and_read_with_it(trained, devices):
    """Unset, merch.score_threshold and merch.unknown_threshold are the checkpoint's own: what the
    val evaluation that saved it chose (the best detection F1; best_threshold over the facings
    matched above that score), read back by evaluation, predict and export."""
    from triskele.eval.model import load_model
    from triskele.train.checkpoints.manager import Checkpoints
    from triskele.train.config.schema import CheckpointConfig
    from triskele.train.domains.merch.detection_metrics import threshold_scores
    from triskele.train.domains.merch.recognition_metrics import best_threshold, match

    checkpoints = Checkpoints(trained / "checkpoints", CheckpointConfig(), read_only=True)
    step = checkpoints.latest_step()
    checkpoints.close()
    logged = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    record = next(r for r in logged if r["step"] == step and "unknown_threshold" in r)
    saved, saved_score = record["unknown_threshold"], record["score_threshold"]
    parts, params, _ = restore_params(trained, mesh_of("data=8"))
    assert parts.config.options.unknown_threshold == saved and parts.config.options.score_threshold == saved_score
    written = json.loads((trained / "config.json").read_text())["merch"]
    assert written["unknown_threshold"] is None and written["score_threshold"] is None
    # The value is val's choice, recomputed here from the val split's detections.
    unset = restore_params(trained, mesh_of("data=8"), overrides={"data.eval_split": "val"})[0]
    totals = unset.domain.evaluator(unset, False).accumulate(params, unset.domain.open_split(unset.config, "val"))
    truths = [boxes[valid > 0] for boxes, valid in zip(totals["true_boxes"], totals["box_valid"], strict=True)]
    chosen_score = threshold_scores(truths, list(totals["boxes"]), list(totals["scores"]), None)["score_threshold"]
    assert chosen_score == pytest.approx(saved_score) and 0.05 <= saved_score < 1
    cosines, right = [], []
    for i, valid in enumerate(totals["box_valid"]):
        truth, skus = truths[i], totals["true_skus"][i][valid > 0]
        for t, d in match(truth, totals["boxes"][i], totals["scores"][i], saved_score):
            cosines.append(totals["sku_cosine"][i][d])
            right.append(skus[t] >= 0 and totals["sku"][i][d] == skus[t])
    assert best_threshold(np.asarray(cosines, np.float64), np.asarray(right, bool))[0] == pytest.approx(saved)
    options = load_model(trained, mesh="data=8").meta["options"]
    assert options["unknown_threshold"] == saved and options["score_threshold"] == saved_score
    chosen = restore_params(trained, mesh_of("data=8"),
                            overrides={"merch.unknown_threshold": 0.25, "merch.score_threshold": 0.4})[0]
    options = chosen.config.options
    assert options.unknown_threshold == 0.25 and options.score_threshold == 0.4  # given wins


def test_a_step_saved_unevaluated_gets_the_domains_threshold_and_a_cut_line_is_passed_over(tmp_path):
    """Never a value chosen on the split being scored: without a val record for the step, 0.3 and 0.5."""
    from triskele.train.run import _fill_chosen_options

    config = shelf_config()
    _fill_chosen_options(config, tmp_path, 7)
    assert config.options.unknown_threshold == 0.5 and config.options.score_threshold == 0.3
    record = json.dumps({"step": 7, "eval_loss": 1.0, "unknown_threshold": 0.375, "score_threshold": 0.25})
    (tmp_path / "metrics.jsonl").write_text(record + '\n{"step": 8, "lo')  # the last line cut short by a kill
    config = shelf_config()
    _fill_chosen_options(config, tmp_path, 7)
    assert config.options.unknown_threshold == 0.375 and config.options.score_threshold == 0.25


@pytest.mark.parametrize("fmt", ["int8", "fp4"])
def test_the_quantized_detector_finds_the_float_detectors_facings(fmt, trained, tmp_path, devices):
    """The detector's Dense kernels quantized: the test photos' top detections keep their boxes and
    scores to within the format's rounding (measured: see SCORE_ERROR), and the val-chosen thresholds
    travel with the copy."""
    from triskele.eval.quantize import quantize_checkpoint

    summary = quantize_checkpoint(trained, fmt, output=tmp_path / fmt, mesh="data=8")
    assert summary["kernel_bytes_float32"] / summary["kernel_bytes"] >= (6.5 if fmt == "fp4" else 3.9)
    results = []
    for workdir in (trained, tmp_path / fmt):
        parts, params, _ = restore_params(workdir, mesh_of("data=8"))
        results.append((parts, evaluate_split(parts, params, parts.domain.open_split(parts.config, "test"))))
    (float_parts, reference), (quantized_parts, got) = results
    assert quantized_parts.config.model.quantization == fmt
    for chosen in ("unknown_threshold", "score_threshold"):
        quantized, unquantized = quantized_parts.config.options, float_parts.config.options
        assert getattr(quantized, chosen) == getattr(unquantized, chosen) is not None
    top = slice(0, 20)  # each photo's 20 highest peaks: the facings it finds (0 past the last one found)
    errors = []
    for found, wanted in zip(got["scores"][:, top], reference["scores"][:, top], strict=True):
        found, wanted = found[found > 0], wanted[wanted > 0]
        common = min(len(found), len(wanted))
        errors.append(np.abs(found[:common] - wanted[:common]).max(initial=0.0))
        # a facing that one finds and the other does not is one at the detection cutoff: no higher
        # than the lowest facing both find, by more than the format's rounding
        extra = np.concatenate([found[common:], wanted[common:]])
        assert (extra < min(found[common - 1], wanted[common - 1]) + SCORE_ERROR[fmt]).all(), (found, wanted)
    score_error = max(errors)
    assert score_error < SCORE_ERROR[fmt], score_error
    same_cell = got["boxes"][:, top] - reference["boxes"][:, top]
    assert np.median(np.abs(same_cell)) < 0.5, np.median(np.abs(same_cell))


SCORE_ERROR = {"int8": 1e-2, "fp4": 0.3}
"""The largest top-20 score error allowed per format; measured on this fixture: int8 2.4e-3, fp4 9.2e-4
(the detector before its refine convolution and space-to-depth edges: 5.0e-5 and 0.219)."""


def write_photo(folder: Path, name: str, index: int, planogram=None) -> ShelfPhoto:
    photo = render_shelf_photo(0, 2, index, (96, 144), 100, min_facings=12)
    Image.fromarray((photo.image * 255).round().astype(np.uint8)).save(folder / f"{name}.png")
    if planogram is not None:
        (folder / f"{name}.json").write_text(planogram if isinstance(planogram, str) else json.dumps(planogram))
    return photo


def test_gallery_then_predict_on_shelf_photos_writes_reports_overlays_and_compliance(trained, tmp_path, devices):
    workdir, photos, refs, out = trained, tmp_path / "photos", tmp_path / "refs", tmp_path / "out"
    photos.mkdir()
    planned = write_photo(photos, "bay0", 0)
    shelves = {"shelves": [[str(s) for s in shelf] for shelf in planned.planogram]}
    (photos / "bay0.json").write_text(json.dumps(shelves))
    write_photo(photos, "bay1", 1)  # no planogram: detections and SKUs only
    write_photo(photos, "gridded", 2, {"rows": [["1", "2"]]})
    write_photo(photos, "broken", 3, "{not json")
    # The references: one picture per SKU the plan names, by the SKU's name (open-set: any SKU).
    for sku in sorted({s for shelf in planned.planogram for s in shelf}):
        (refs / str(sku)).mkdir(parents=True)
        package_render(0, sku, 5).save(refs / str(sku) / "front.png")
    predict = ["predict", "--workdir", str(workdir), "--input", str(photos), "--output", str(out), "--mesh", "data=8",
               "--no-progress"]
    assert eval_main(predict) == 2  # a planogram without a gallery to recognise its SKUs: refused
    assert not out.exists()
    assert eval_main(["gallery", "--workdir", str(workdir), "--input", str(refs), "--mesh", "data=8"]) == 0
    assert eval_main(predict) == 1  # two photos' planograms are unreadable: listed, the rest predicted
    report = json.loads((out / "bay0.json").read_text())
    assert report["photo"] == "bay0.png" and report["found"] == len(report["facings"]) > 0
    assert report["planned"] == sum(map(len, planned.planogram)) and 0 <= report["score"] <= 1
    assert sum(report["counts"].values()) >= 1 and len(report["rows"]) >= len(planned.planogram)
    facing = report["facings"][0]
    assert set(facing) == {"box", "sku", "confidence", "similarity", "row", "status"}
    assert all(0 <= v <= 144 for f in report["facings"] for v in f["box"][::2])
    bare = json.loads((out / "bay1.json").read_text())
    assert "score" not in bare and all(f["status"] is None for f in bare["facings"])
    assert Image.open(out / "bay0.png").size[0] >= 144
    lines = (out / "compliance.csv").read_text().splitlines()
    assert lines[0] == "photo,planned,found,ok,misplaced,foreign,missing,out_of_stock,extra,score"
    assert sorted(line.split(",")[0] for line in lines[1:]) == ["bay0.png", "bay1.png"]
    errors = (out / "errors.csv").read_text()
    assert "is a grid ('rows')" in errors and "broken.json is not valid" in errors
    summary = json.loads((out / "summary.json").read_text())
    assert eval_main(predict) == 1  # a rerun predicts nothing again
    assert json.loads((out / "summary.json").read_text())["skipped"] == summary["written"] == 2
    # At twice the scale the photo is cut into more tiles; boxes come back in the photo's own pixels.
    zoomed = tmp_path / "zoomed"
    assert eval_main([*predict[:6], str(zoomed), "--mesh", "data=8", "--no-progress", "--shelf-scale", "2"]) == 1
    bay = json.loads((zoomed / "bay0.json").read_text())
    assert bay["found"] > 0 and all(0 <= v <= 144 for f in bay["facings"] for v in f["box"][::2])
    # A score threshold given over the val-chosen one keeps the facings above it (the report's
    # confidences are rounded to 4 decimals: the cut sits between two such values).
    confidences = [f["confidence"] for f in report["facings"]]
    stricter, cut = tmp_path / "stricter", round(float(np.median(confidences)), 4) + 0.00005
    assert eval_main([*predict[:6], str(stricter), "--mesh", "data=8", "--no-progress", "--score-threshold",
                      str(cut)]) == 1
    strict = json.loads((stricter / "bay0.json").read_text())
    kept = [f["confidence"] for f in strict["facings"]]  # those above the cut, and below it the shelf gaps' own
    assert sum(c > cut for c in kept) == sum(c > cut for c in confidences) and len(kept) < report["found"]
    assert all(c >= GAP_FILL * cut for c in kept)
    # Exported (jax.export, carrying the gallery), the detector writes the same reports, alone.
    exported = export_model(workdir, tmp_path / "shelf.jax", batch="dynamic")["output"]
    alone = tmp_path / "alone"
    assert eval_main(["predict", "--exported", exported, "--input", str(photos), "--output", str(alone),
                      "--no-progress"]) == 1
    again = json.loads((alone / "bay0.json").read_text())
    assert [f["sku"] for f in again["facings"]] == [f["sku"] for f in report["facings"]]
    np.testing.assert_allclose([f["box"] for f in again["facings"]], [f["box"] for f in report["facings"]],
                               atol=0.2)
    assert again["counts"] == report["counts"]


def test_the_shelf_preset_is_the_detector_and_a_bad_task_is_named(tmp_path, capsys):
    config = make_config("merch-shelf-tiny")
    assert (config.options.task, config.checkpoint.best_metric, config.model.image_size) == ("shelf", "ap", 256)
    assert config.checkpoint.best_mode == "max"  # the checkpoint kept is the highest AP's
    assert make_config("merch-tiny").options.task == "recognition"
    from triskele.train.domains import spec_for

    shelf, recognition = spec_for(config), spec_for(make_config("merch-tiny"))
    assert shelf.class_names(config) == ["facing"] and shelf.inference == "triskele.eval.domains.merch.shelf"
    assert recognition.class_names(make_config("merch-tiny"))[-1] == "empty"
    assert recognition.inference == "triskele.eval.domains.merch" and shelf.build_model is not recognition.build_model
    assert train_main(["--preset", "merch-tiny", "--workdir", str(tmp_path), "--set", "merch.task=shelves",
                       "--steps", "1", "--no-progress"]) == 2
    assert "merch.task='shelves' is not one of recognition, shelf" in capsys.readouterr().err


def test_a_photo_with_more_facings_than_the_padding_is_an_error():
    source = make_config("merch-shelf-tiny", {"merch.max_boxes": 10})
    from triskele.train.domains.merch.shelf_photos import ShelfPhotos

    photos = ShelfPhotos("train", 4, 128, max_boxes=source.options.max_boxes)
    with pytest.raises(ValueError, match=r"synthetic shelf photo train/0 holds \d+ facings, more than "
                                         r"merch.max_boxes=10; raise merch.max_boxes to at least \d+"):
        photos.load(0)
    assert json.dumps(photos.photo(0).planogram)  # the plan is plain JSON
