"""Predict's output names and model identities without a trained model: keys
relative to the inputs' common root, the input's suffix kept where two inputs share a stem, clashes
refused before anything runs, and an identity for a checkpoint and an export."""

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from PIL import Image
from trainutil import mesh_of
from triskele.eval.engine import input_units
from triskele.eval.load_export import load_exported
from triskele.eval.model import LiveModel
from triskele.train.run import restore_params

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
MARS_META = {"image_size": 16, "channels": 1, "options": {"scale": 1.0}}


def _picture(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((20, 20), 100, np.uint8)).save(path)
    return path


def _mars(**options):
    from triskele.eval.domains.mars import predict_io

    return predict_io(MARS_META, options)


def test_inputs_listed_from_two_folders_are_named_from_their_common_root(tmp_path):
    first, second = _picture(tmp_path / "x" / "a" / "img.png"), _picture(tmp_path / "y" / "b" / "img.png")
    listing = tmp_path / "lists" / "inputs.txt"
    listing.parent.mkdir()
    listing.write_text(f"{first}\n../y/b/img.png\n")
    units = input_units(_mars(), listing)
    assert [u.key for u in units] == ["x/a/img.png", "y/b/img.png"]
    assert [u.paths[0].resolve() for u in units] == [first.resolve(), second.resolve()]


def test_inputs_of_one_stem_keep_their_suffix_in_their_outputs_names(tmp_path):
    for name in ("frame.jpg", "frame.png", "other.jpg", "sub/frame.png"):
        _picture(tmp_path / "in" / name)
    units = {u.key: u for u in input_units(_mars(overlay=True), tmp_path / "in")}
    assert {key: u.named(".png") for key, u in units.items()} == {
        "frame.jpg": "frame.jpg.png", "frame.png": "frame.png.png", "other.jpg": "other.png",
        "sub/frame.png": "sub/frame.png"}
    assert units["frame.jpg"].named(".overlay.png") == "frame.jpg.overlay.png"


def test_outputs_that_would_clash_are_refused_up_front_naming_both_inputs(tmp_path):
    _picture(tmp_path / "in" / "x.png")
    _picture(tmp_path / "in" / "x.overlay.png")
    assert len(input_units(_mars(), tmp_path / "in")) == 2  # no overlays: no clash
    with pytest.raises(ValueError, match=r"inputs x.overlay.png and x.png would both write x.overlay.png"):
        input_units(_mars(overlay=True), tmp_path / "in")

    from triskele.eval.domains.merch import predict_io as merch_io

    _picture(tmp_path / "shelves" / "summary.png")
    (tmp_path / "shelves" / "summary.json").write_text('{"rows": [["a"]]}')
    meta = {"image_size": 16, "class_names": ["a"], "channels": 3}
    with pytest.raises(ValueError, match=r"input summary.png would write summary.json, which predict writes itself"):
        input_units(merch_io(meta, {}, None), tmp_path / "shelves")


def test_two_inputs_of_one_name_are_refused_up_front_naming_both(tmp_path):
    from triskele.eval.domains.deepfake import predict_io as deepfake_io

    root = tmp_path / "v"
    for frame in ("0.png", "1.png"):
        _picture(root / frame)  # frames directly under the root: a video named after the root, "v"
        _picture(root / "v" / frame)  # and a folder of frames named "v" under it
    io = deepfake_io({"image_size": 16, "frames": 1, "options": {"frames_per_video": 4}}, {})
    with pytest.raises(ValueError, match=rf"inputs {root} and {root / 'v'} would both be named 'v'"):
        input_units(io, root)


def test_a_checkpoint_is_identified_by_its_step_and_parameters_on_any_mesh(tmp_path):
    run = shutil.copytree(LEGACY / "mars-run", tmp_path / "mars-run")
    parts, params, step = restore_params(run, mesh_of("single"))
    one = LiveModel(parts, params, step=step).identity
    assert one["step"] == 2 and one["format"] == "float32" and len(one["params_sha256"]) == 64
    parts, params, step = restore_params(run, mesh_of("data=2,tensor=4"))
    assert LiveModel(parts, params, step=step).identity == one
    nudged = dict(params, classify=jax.tree.map(lambda a: a + np.float32(1e-6), params["classify"]))
    other = LiveModel(parts, nudged, step=step).identity
    assert other["step"] == one["step"] and other["params_sha256"] != one["params_sha256"]


def test_an_export_is_identified_by_its_sha256():
    exported = load_exported(LEGACY / "mars.jax")
    assert exported.identity == {"export_sha256": exported.meta["sha256"], "step": exported.meta["step"]}


def test_shelves_without_a_gallery_are_refused_naming_the_command_that_builds_one(tmp_path):
    """A run's shelves name `gallery --workdir RUN`; an export alone names the run it
    was exported from, and that exporting again carries the index."""
    from triskele.eval.domains.merch import predict_io as merch_io

    _picture(tmp_path / "in" / "shelf.png")
    (tmp_path / "in" / "shelf.json").write_text('{"rows": [["a"]]}')
    meta = {"image_size": 16, "class_names": ["a"], "channels": 3}
    with pytest.raises(ValueError, match=rf"build one with python -m triskele.eval gallery --workdir {tmp_path}/run "
                                         "--input REFERENCE_FOLDER$"):
        input_units(merch_io(meta, {}, tmp_path / "run"), tmp_path / "in")
    exported = {**meta, "source": "/runs/shop", "identity": {"export_sha256": "ab" * 32, "step": 3}}
    with pytest.raises(ValueError, match=r"gallery --workdir /runs/shop --input REFERENCE_FOLDER, then export again "
                                         r"\(the export carries it\) or predict with --workdir /runs/shop"):
        input_units(merch_io(exported, {}, None), tmp_path / "in")


# --- mars' masks from hand-made logits ------------------------------------

def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_mars_flip_tta_mirrors_the_windows_and_flips_their_logits_back(tmp_path):
    """A 16-px frame is one window: its probabilities are the mean of the plain window's softmax and
    the softmax of the mirrored window's logits mirrored back, computed here in numpy. Without the
    flip back, 52% of this case's pixels change class (any share above 0 fails)."""
    io = _mars(tta="flip")
    picture = tmp_path / "in" / "frame.png"
    picture.parent.mkdir()
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (16, 16), np.uint8)).save(picture)
    [unit] = input_units(io, picture.parent)
    windows, context = io.read(unit)
    assert windows.shape == (2, 16, 16, 1)
    np.testing.assert_array_equal(windows[1], windows[0][:, ::-1], "the second window is the first mirrored")
    rng = np.random.default_rng(4)
    plain, mirrored = rng.normal(size=(2, 1, 16, 16, 4)).astype(np.float32)
    got = io.probabilities(np.concatenate([plain, mirrored]), *context)
    expected = (_softmax(plain[0]) + _softmax(mirrored[0][:, ::-1])) / 2
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    unflipped = (_softmax(plain[0]) + _softmax(mirrored[0])) / 2
    assert (unflipped.argmax(-1) != expected.argmax(-1)).mean() > 0.3, "the case must tell the two apart"
    # A mirror-equivariant model (mirrored window -> mirrored logits) gives the plain pass back.
    equivariant = io.probabilities(np.concatenate([plain, plain[:, :, ::-1]]), *context)
    np.testing.assert_allclose(equivariant, _softmax(plain[0]), rtol=1e-5, atol=1e-6)


CLASS_COLOURS = {"soil": (170, 120, 80), "bedrock": (120, 120, 130), "sand": (235, 200, 110),
                 "big_rock": (200, 40, 40)}
"""Mars' classes in AI4Mars' label order (0 soil, 1 bedrock, 2 sand, 3 big rock) and their colours."""


def test_a_written_mars_mask_holds_the_class_of_each_pixels_largest_logit_in_its_colour(tmp_path):
    """Two overlapping 16-px windows of a 16 x 24 frame whose logits favour a known class at each
    pixel (stripes of all four classes): the palette PNG read back holds exactly those classes,
    each shown in its class's colour, and the row counts them. A swap of two classes anywhere
    between the logits and the file (stitching, argmax, the writer, the palette) fails it."""
    from triskele.models.mars import CLASS_NAMES
    from triskele.models.sliding import window_boxes

    assert CLASS_NAMES == tuple(CLASS_COLOURS)
    io = _mars()
    picture = tmp_path / "in" / "frame.png"
    picture.parent.mkdir()
    Image.fromarray(np.full((16, 24), 90, np.uint8)).save(picture)
    [unit] = input_units(io, picture.parent)
    windows, context = io.read(unit)
    assert context == ((16, 24), (16, 24))
    rows, columns = np.mgrid[:16, :24]
    classes = (columns // 6 + rows // 8) % 4
    favoured = 4.0 * np.eye(4, dtype=np.float32)[classes] + np.random.default_rng(5).normal(0, 0.3, (16, 24, 4))
    boxes = window_boxes(16, 24, 16, io.stride)
    assert len(boxes) == len(windows) == 2
    logits = np.stack([favoured[top:top + 16, left:left + 16] for top, left in boxes]).astype(np.float32)
    out = tmp_path / "out"
    row = io.write(unit, context, {"logits": logits}, out)
    mask = Image.open(out / row["mask"])
    np.testing.assert_array_equal(np.asarray(mask), classes)
    assert row["class_pixels"] == np.bincount(classes.ravel(), minlength=4).tolist() == [96, 96, 96, 96]
    shown = np.asarray(mask.convert("RGB"))
    for index, (name, colour) in enumerate(CLASS_COLOURS.items()):
        assert {tuple(c) for c in shown[classes == index]} == {colour}, name
