import json
import shutil

import numpy as np
import pytest
from PIL import Image
from sklearn.metrics import confusion_matrix
from test_mars_data import write_ai4mars
from trainutil import run
from triskele.eval.cli import main as eval_main
from triskele.eval.domains.mars import predict_io
from triskele.eval.engine import iter_predictions
from triskele.eval.model import load_model
from triskele.eval.report import evaluate_checkpoint
from triskele.models.mars import CLASS_NAMES
from triskele.train.cli import main as train_main
from triskele.train.domains.mars.evaluator import MarsEvaluator
from triskele.train.domains.mars.pictures import IGNORE_COLOUR, PALETTE, legend_entries


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("mars")
    run(workdir, "data=8", **{"run.steps": 4, "optim.lr": 3e-3})
    return workdir


@pytest.fixture(scope="module")
def model(trained):
    return load_model(trained, mesh="data=8")


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _square_resize_mious(model) -> tuple[float, float]:
    """The report's square_resize mIoU computed here: each test frame's centre square squeezed to the
    model's 32 px with PIL (label nearest, image bilinear), one forward pass, scikit-learn's confusion
    matrix, the mean IoU of the classes present; with each pixel's largest logit (right) and its
    smallest (the slip the check must catch)."""
    source = model.parts.domain.open_split(model.parts.config, "test")
    labels, images = [], []
    for index in range(len(source)):
        record = source.load(index)
        height, width = record["label"].shape
        side = min(height, width)
        box = ((width - side) // 2, (height - side) // 2, (width - side) // 2 + side, (height - side) // 2 + side)
        labels.append(np.asarray(Image.fromarray(record["label"].astype(np.uint8)).crop(box)
                                 .resize((32, 32), Image.NEAREST)))
        image = record["image"]
        assert image.shape[:2] == (height, width)
        images.append(np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(image[..., k]), mode="F").crop(box)
                                           .resize((32, 32), Image.BILINEAR)) for k in range(image.shape[-1])], -1))
    logits = np.asarray(model(np.stack(images).astype(np.float32))["logits"])
    truth = np.stack(labels)
    labelled = truth != 255

    def miou(predicted: np.ndarray) -> float:
        confusion = confusion_matrix(truth[labelled], predicted[labelled], labels=[0, 1, 2, 3])
        hits = np.diag(confusion)
        union = confusion.sum(0) + confusion.sum(1) - hits
        return float(np.mean(hits[union > 0] / union[union > 0]))

    return miou(logits.argmax(-1)), miou(logits.argmin(-1))


def test_a_run_folder_that_cannot_take_the_report_is_named_before_evaluating_and_output_is_the_way(
        trained, tmp_path, capsys):
    """A run store the report cannot be written to (read-only as mounted; here its eval/ blocked by
    a file, which fails as well for root) is refused before the evaluation, naming the folder and
    --output; with --output the report and pictures go there and the run's folder is left alone."""
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir, ignore=shutil.ignore_patterns("eval"))
    (workdir / "eval").write_text("not a folder")
    with pytest.raises(ValueError, match=r"cannot be written to .*eval/4: .*give --output DIR"):
        evaluate_checkpoint(workdir, mesh="data=8")
    assert eval_main(["--workdir", str(workdir), "--mesh", "data=8"]) == 2
    assert "give --output DIR" in capsys.readouterr().err
    out = tmp_path / "report"
    assert eval_main(["--workdir", str(workdir), "--mesh", "data=8", "--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["step"] == 4 and all((out / name).is_file() for name in report["files"]) and report["files"]
    assert report["workdir"] == str(workdir.resolve())  # the report names the run it scores
    assert (workdir / "eval").read_text() == "not a folder"


def test_evaluation_on_another_mesh_gives_the_same_metrics(trained, devices):
    on_training_mesh = evaluate_checkpoint(trained, mesh="data=8")
    elsewhere = evaluate_checkpoint(trained, mesh="fsdp=4,tensor=2")
    assert on_training_mesh["step"] == elsewhere["step"] == 4
    assert elsewhere["mesh"] == {"pipeline": 1, "data": 1, "fsdp": 4, "tensor": 2}
    a, b = on_training_mesh["metrics"], elsewhere["metrics"]
    assert a["pixel_acc"] == pytest.approx(b["pixel_acc"], abs=1e-4)
    assert a["miou"] == pytest.approx(b["miou"], abs=1e-4)
    for name in a["iou"]:
        assert a["iou"][name] == pytest.approx(b["iou"][name], abs=1e-3, nan_ok=True)
    assert 0 < a["pixel_acc"] < 1


def test_eval_cli_writes_report_plot_and_overlays(trained, model, capsys):
    assert eval_main(["--workdir", str(trained), "--mesh", "data=2,fsdp=2,tensor=2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = trained / "eval" / "4"
    report = json.loads((out / "report.json").read_text())
    assert report["step"] == 4 and report["split"] == "test" and report["records"] == 40
    assert {"pixel_acc", "miou", "iou", "recall"} <= set(report["metrics"])
    assert set(report["metrics"]["iou"]) == {"soil", "bedrock", "sand", "big_rock"}
    assert printed["metrics"] == report["metrics"]
    for name in ["confusion.png", "overlay_0.png"]:
        assert Image.open(out / name).size[0] > 0
    overlay = np.asarray(Image.open(out / "overlay_0.png"))
    # Whole frames (48 px for a 32-px model): three panels enlarged 6x to 288 px (nearest
    # neighbour), 8-px gaps, a 28-px legend.
    assert overlay.shape == (288 + 28, 3 * 288 + 2 * 8, 3)
    truth = overlay[:288, 288 + 8 : 2 * 288 + 8]
    assert (truth[::6, ::6] == truth[5::6, 5::6]).all(), "labels are enlarged by nearest neighbour"
    assert report["inference"] == {"mode": "slide", "window": 32, "stride": 21, "resolution": "native", "scale": 1.0}
    # The square-resize figure recomputed here: 0.1600 for this model (the same to round-off); the
    # class of the smallest logit gives 0.0163. The margin, 0.01, is far inside that gap.
    right, smallest_logit = _square_resize_mious(model)
    assert abs(right - smallest_logit) > 0.1, "the case must tell the two apart"
    assert report["square_resize"]["miou"] == pytest.approx(right, abs=0.01)


def test_predict_writes_one_class_mask_per_image_at_its_size(trained, tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 40), np.uint8)).save(inputs / "square.png")
    Image.fromarray(rng.integers(0, 255, (30, 50, 3), np.uint8)).save(inputs / "wide.jpg")
    code = eval_main(["predict", "--workdir", str(trained), "--input", str(inputs), "--output", str(tmp_path / "out"),
                      "--mesh", "data=8"])
    assert code == 0, capsys.readouterr().err
    square = np.asarray(Image.open(tmp_path / "out" / "square.png"))
    wide = np.asarray(Image.open(tmp_path / "out" / "wide.png"))
    assert square.shape == (40, 40) and set(np.unique(square)) <= {0, 1, 2, 3}
    assert wide.shape == (30, 50) and set(np.unique(wide)) <= {0, 1, 2, 3}  # every pixel, not the centre only


def test_predicted_masks_show_their_classes_and_overlays_are_enlarged(trained, model, tmp_path, capsys):
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64), np.uint8)).save(inputs / "small.png")
    code = eval_main(["predict", "--workdir", str(trained), "--input", str(inputs), "--output", str(out),
                      "--mesh", "data=8", "--overlay"])
    assert code == 0, capsys.readouterr().err
    mask = Image.open(out / "small.png")
    assert mask.mode == "P", "a palette PNG: a viewer shows colours, a reader gets the class indices"
    palette = np.asarray(mask.getpalette(), np.uint8).reshape(-1, 3)
    np.testing.assert_array_equal(palette[: len(PALETTE)], PALETTE)
    assert tuple(palette[255]) == IGNORE_COLOUR
    io = predict_io(model.meta, {})
    [prediction] = iter_predictions(model, io, inputs)
    expected = io.probabilities(prediction.outputs["logits"], *prediction.context).argmax(-1)
    np.testing.assert_array_equal(np.asarray(mask), expected)
    # Evaluation scores the same image against the written mask as its label: every pixel agrees.
    # With two classes swapped on the way to the file (soil and sand: 39% of this mask) it is 0.61.
    pixels = np.asarray(Image.open(inputs / "small.png"), np.float32)[..., None] / 255

    class WrittenMask:
        def __len__(self):
            return 1

        def load(self, index, rng=None):
            return {"image": pixels, "label": np.asarray(mask)}

    evaluator = MarsEvaluator(model.parts)
    assert evaluator.metrics(evaluator.accumulate(model.params, WrittenMask()))["pixel_acc"] == 1.0
    picture = np.asarray(Image.open(out / "small.overlay.png"))
    assert picture.shape[0] >= 256 + 24, "a 64-px input is enlarged as evaluation's overlays are"
    blend = picture[:256, :256]
    assert (blend[::4, ::4] == blend[3::4, 3::4]).all(), "enlarged by nearest neighbour"
    assert [name for name, _ in legend_entries(ignored=False)] == list(CLASS_NAMES), "a prediction has no ignored"
    assert [name for name, _ in legend_entries(ignored=True)] == [*CLASS_NAMES, "ignored"]


def test_flip_tta_averages_the_plain_and_the_mirrored_pass_flipped_back(trained, model, tmp_path, capsys):
    """A 32-px input is one window: its --tta flip mask is the argmax of the mean of the softmax of
    the model's logits for it and of those for its mirror image, mirrored back, computed here. Without
    the flip back 34% of this mask's pixels change (any change fails); the plain pass alone differs
    by 33%."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    pixels = np.random.default_rng(2).integers(0, 255, (32, 32), np.uint8)
    Image.fromarray(pixels).save(inputs / "one.png")
    code = eval_main(["predict", "--workdir", str(trained), "--input", str(inputs), "--output", str(out),
                      "--mesh", "data=8", "--tta", "flip", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    frame = (pixels.astype(np.float32) / 255)[None, :, :, None]
    plain = np.asarray(model(frame)["logits"])[0]
    mirrored = np.asarray(model(np.ascontiguousarray(frame[:, :, ::-1]))["logits"])[0]
    expected = (_softmax(plain) + _softmax(mirrored[:, ::-1])).argmax(-1)
    assert (expected != (_softmax(plain) + _softmax(mirrored)).argmax(-1)).mean() > 0.1, "the case tells them apart"
    np.testing.assert_array_equal(np.asarray(Image.open(out / "one.png")), expected)


def test_eval_errors(tmp_path, capsys):
    assert eval_main(["--workdir", str(tmp_path)]) == 2
    assert "has no checkpoints/ folder" in capsys.readouterr().err


def test_train_and_evaluate_on_ai4mars_layout(tmp_path, capsys):
    write_ai4mars(tmp_path / "ai4mars")
    workdir = tmp_path / "run"
    code = train_main(["--workdir", str(workdir), "--data", str(tmp_path / "ai4mars"), "--steps", "2",
                       "--mesh", "data=2,tensor=4", "--no-progress", "--set", "data.global_batch=2",
                       "--set", "model.image_size=32", "--set", "run.eval_every=0"])
    assert code == 0, capsys.readouterr().err
    assert "2 labelled images, 1 images without a label skipped" in capsys.readouterr().out
    report = evaluate_checkpoint(workdir, mesh="data=2,tensor=4")
    assert report["records"] == 1 and report["data"] == str(tmp_path / "ai4mars")
