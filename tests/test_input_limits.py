"""One crafted input never aborts a job, and what it costs follows the pixels allowed: image, video and
planogram limits checked from headers before decoding (`limits.*`), only PNG and JPEG opened, every
reader (predict, training's `data.bad_records`, prepare) refusing such an input with its reason
while the good ones go on, and a video decoded once."""

import csv
import json
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from triskele.eval.cli import main as eval_main
from triskele.train.config.limits import input_limits
from triskele.train.config.overrides import make_config
from triskele.train.config.schema import InputLimits
from triskele.train.data.png import png_file

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
# PIL warns of an image between its limit (set from limits.image_pixels) and twice that; the readers
# refuse those themselves (and silence the warning outside pytest, which shows it again).
pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")


@pytest.fixture(autouse=True)
def _pil_limit(monkeypatch):
    """The readers set PIL's process-wide limit from theirs: put it back for the other tests."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)


def write_png(path: Path, width: int, height: int, rows: bool = True, channels: int = 1) -> Path:
    """A PNG declaring width x height 8-bit pixels (grey, or RGB with 3 channels), written a row at a
    time; `rows` False leaves out the pixel data (the 65-byte 'bomb': a header and nothing else)."""
    deflate, row = zlib.compressobj(9), b"\x00" * (1 + width * channels)
    data = b"".join(deflate.compress(row) for _ in range(height if rows else 0)) + deflate.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png_file(width, height, channels, data))
    return path


def picture(path: Path, size: int = 32, mode: str = "L", format: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (size, size) if mode == "L" else (size, size, 3)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, shape, np.uint8)).save(path, format=format)
    return path


def errors_of(out: Path) -> dict[str, str]:
    return {r["input"]: r["reason"] for r in csv.DictReader((out / "errors.csv").open())}


def test_the_limits_are_config_keys_with_their_defaults_and_predict_sets_only_them():
    assert InputLimits() == InputLimits(image_pixels=25_000_000, frame_pixels=4096 * 2160, video_frames=54_000,
                                        planogram_facings=1000, planogram_bytes=1 << 20)
    assert make_config("mars-tiny", {"limits.video_frames": 10}).limits.video_frames == 10
    assert input_limits(["limits.image_pixels=4_000"]) == InputLimits(image_pixels=4000)
    with pytest.raises(ValueError, match=r"'limits.planogram_bytes' is 0; it must be at least 1"):
        make_config("merch-tiny", {"limits.planogram_bytes": 0})
    with pytest.raises(ValueError, match=r"--set data.path=...: only the input limits are set here"):
        input_limits(["data.path=/x"])


def test_mars_predict_lists_a_bomb_a_tiff_and_an_image_over_the_limit_and_writes_the_good_ones(tmp_path):
    run = shutil.copytree(LEGACY / "mars-run", tmp_path / "run")
    inputs = tmp_path / "in"
    bomb = write_png(inputs / "bomb.png", 50_000, 50_000, rows=False)
    assert bomb.stat().st_size < 70
    picture(inputs / "tiff.png", format="TIFF")
    picture(inputs / "large.png", size=40)  # 1,600 pixels: over the limit this run sets
    picture(inputs / "a.png")
    picture(inputs / "b.jpg", mode="RGB")
    out = tmp_path / "out"
    assert eval_main(["predict", "--workdir", str(run), "--input", str(inputs), "--output", str(out), "--mesh",
                      "data=8", "--no-progress", "--set", "limits.image_pixels=1500"]) == 1
    assert Image.open(out / "a.png").size == (32, 32) and Image.open(out / "b.png").size == (32, 32)
    errors = errors_of(out)
    assert set(errors) == {"bomb.png", "tiff.png", "large.png"}
    assert errors["bomb.png"] == (f"cannot read image {bomb}: its header declares more than 3,000 pixels, over "
                                  "limits.image_pixels=1,500 (--set limits.image_pixels=N raises it)")
    assert errors["tiff.png"] == (f"cannot read image {inputs / 'tiff.png'}: a TIFF file (named .png); only PNG and "
                                  "JPEG images are read")
    assert errors["large.png"].startswith(f"cannot read image {inputs / 'large.png'}: 40x40 = 1,600 pixels, over "
                                          "limits.image_pixels=1,500")
    assert json.loads((out / "summary.json").read_text())["unreadable"] == 3


class _Model:
    """A stand-in for a merch model (the engine's interface): every record's embedding is gallery
    SKU 'sku0''s."""

    batch = 8
    identity = {"step": 1, "format": "float32", "params_sha256": "0" * 64}
    meta = {"domain": "merch", "image_size": 16, "channels": 3, "frames": 1, "normalisation": "none",
            "options": {"num_skus": 1}, "class_names": ["sku0", "empty"]}

    def dispatch(self, records):
        return len(records)

    def fetch(self, count):
        embedding = np.tile(np.array([[1.0, 0.0]], np.float32), (count, 1))
        return {"embedding": embedding, "probabilities": np.full((count, 2), 0.5, np.float32)}


PLANOGRAMS = {
    "empty_row": ('{"rows": [[]]}', "'rows' must be a non-empty list"),
    "no_rows": ('{"cols": 0}', "it must be a JSON object with 'rows'"),
    "a_list": ("[1, 2]", "it must be a JSON object with 'rows'"),
    "grid_string": ('{"rows": [["sku0"]], "grid": {"left": "0", "top": 0, "width": 8, "height": 8}}', "'grid' must be"),
    "grid_missing_key": ('{"rows": [["sku0"]], "grid": {"left": 0, "top": 0, "width": 8}}', "'grid' must be"),
    "grid_zero": ('{"rows": [["sku0"]], "grid": {"left": 0, "top": 0, "width": 0, "height": 8}}', "'grid' must be"),
    "grid_infinite": ('{"rows": [["sku0"]], "grid": {"left": 0, "top": 0, "width": Infinity, "height": 8}}',
                      "(finite numbers)"),
    "grid_outside": ('{"rows": [["sku0"]], "grid": {"left": 20, "top": 0, "width": 20, "height": 32}}',
                     "reaches outside the image (32x32 pixels)"),
    "cells_under_a_pixel": (json.dumps({"rows": [["sku0"] * 40]}), "makes facings under a pixel (1 x 40 facings)"),
    "sku_a_list": ('{"rows": [[["sku0"]]]}', 'a SKU must be a string, an integer or null (a gap), not ["sku0"]'),
    "nested": ("[" * 100_000, "its JSON is nested too deeply"),
    "too_many_facings": (json.dumps({"rows": [["sku0"] * 30] * 40}),
                         "40 x 30 = 1,200 facings, over limits.planogram_facings=1,000"),
    "too_large": ('{"rows": [["sku0"]]}' + " " * (1 << 20), "the file is 1,048,596 bytes, over "
                                                           "limits.planogram_bytes=1,048,576"),
}


def test_broken_planograms_go_to_errors_csv_with_their_reasons_and_the_good_shelf_is_written(tmp_path):
    from triskele.eval.domains.merch import predict_io
    from triskele.eval.domains.merch.gallery import gallery_path
    from triskele.eval.engine import predict_files
    from triskele.eval.model import input_preprocessing

    model = _Model()
    built = {"model": model.identity, "preprocessing": input_preprocessing(model.meta), "references": ""}
    gallery_path(tmp_path).parent.mkdir(parents=True)
    np.savez(gallery_path(tmp_path), embeddings=np.eye(2, dtype=np.float32), names=np.array(["sku0", "empty"]),
             built_with=np.array(json.dumps(built)))
    inputs = tmp_path / "in"
    for name, (plan, _) in {"good": ('{"rows": [["sku0", "sku0"], ["sku0", null]]}', ""), **PLANOGRAMS}.items():
        picture(inputs / f"{name}.png", mode="RGB")
        (inputs / f"{name}.json").write_text(plan)
    io = predict_io({**model.meta, "identity": model.identity}, {}, tmp_path)
    summary = predict_files(model, io, inputs, tmp_path / "out", progress=False)
    report = json.loads((tmp_path / "out" / "good.json").read_text())
    assert report["counts"] == {"ok": 3, "wrong_sku": 0, "gap": 0, "unexpected": 1}
    assert (tmp_path / "out" / "good.png").is_file()
    errors = errors_of(tmp_path / "out")
    assert set(errors) == {f"{name}.png" for name in PLANOGRAMS} and summary["unreadable"] == len(PLANOGRAMS)
    for name, (_, reason) in PLANOGRAMS.items():
        assert reason in errors[f"{name}.png"], (name, errors[f"{name}.png"])
        assert str(inputs / name) in errors[f"{name}.png"], "the reason names the file"


def test_the_shelf_overlay_is_enlarged_no_further_than_the_pixel_limit():
    from triskele.eval.domains.merch import compliance_report, shelf_overlay

    report = compliance_report(np.array([["a"] * 16] * 16, dtype=object), np.array([["a"] * 16] * 16, dtype=object))
    photo = Image.new("RGB", (64, 64))
    assert shelf_overlay(photo, report, None).height > 64 * 24  # 4-pixel facings enlarged to 96, a legend below
    assert shelf_overlay(photo, report, None, max_pixels=64 * 64 * 9).height < 64 * 6  # enlarged 3 times


def _terrain(root: Path, names: list[str]) -> None:
    """A generic mars layout: 32-px images and their masks."""
    (root / "masks").mkdir(parents=True)
    for name in names:
        picture(root / "images" / f"{name}.png")
        Image.fromarray(np.zeros((32, 32), np.uint8)).save(root / "masks" / f"{name}.png")


def _mars_split(overrides: dict):
    from triskele.train.domains import get_domain

    config = make_config("mars-tiny", overrides)
    get_domain("mars").resolve(config)
    return get_domain("mars").open_split(config, "test")


def test_training_skips_a_bomb_with_its_reason_or_stops_naming_it_and_a_run_sets_its_limits(tmp_path):
    from triskele.train.data.bad_records import tolerant

    _terrain(tmp_path, ["a", "b", "c"])
    write_png(tmp_path / "images" / "b.png", 50_000, 50_000, rows=False)
    picture(tmp_path / "images" / "c.png", format="TIFF")
    source = _mars_split({"data.path": str(tmp_path)})
    with pytest.raises(ValueError, match=rf"^cannot read image {tmp_path}/images/b.png: its header declares more "
                                         r"than 50,000,000 pixels, over limits.image_pixels=25,000,000"):
        source.load(1)
    with pytest.raises(ValueError, match=rf"^cannot read image {tmp_path}/images/c.png: a TIFF file"):
        source.load(2)
    log = tmp_path / "bad_records.txt"
    skipping = tolerant(source, "skip", "test", log)
    np.testing.assert_array_equal(skipping.load(1)["image"], source.load(0)["image"])  # wrapped around to a.png
    assert skipping.load(2)["image"].shape == (32, 32, 1)
    listed = [line.split("\t") for line in log.read_text().splitlines()]
    assert [(split, index) for split, index, _ in listed] == [("test", "1"), ("test", "2")]
    assert "over limits.image_pixels=25,000,000" in listed[0][2] and "a TIFF file" in listed[1][2]

    with pytest.raises(ValueError, match=r"a.png: 32x32 = 1,024 pixels, over limits.image_pixels=1,000"):
        _mars_split({"data.path": str(tmp_path), "limits.image_pixels": 1000}).load(0)


class _Counted:
    """cv2.VideoCapture, counting the frames decoded (grab, read) and converted (retrieve); `frames`
    stands in for the header's frame count (a header that lies)."""

    grabbed = retrieved = 0

    def __init__(self, capture, frames: int | None):
        self.capture, self.frames = capture, frames

    def get(self, prop):
        import cv2

        return self.frames if prop == cv2.CAP_PROP_FRAME_COUNT and self.frames is not None else self.capture.get(prop)

    def grab(self):
        ok = self.capture.grab()
        _Counted.grabbed += ok
        return ok

    def retrieve(self):
        ok, frame = self.capture.retrieve()
        _Counted.retrieved += ok
        return ok, frame

    def read(self):
        ok, frame = self.capture.read()
        _Counted.grabbed += ok
        _Counted.retrieved += ok
        return ok, frame

    def __getattr__(self, name):
        return getattr(self.capture, name)


@pytest.fixture
def counted(monkeypatch):
    """Counts decoding on every video opened; returns a function that sets the header's frame count."""
    cv2 = pytest.importorskip("cv2")
    real, declared = cv2.VideoCapture, {"frames": None}
    monkeypatch.setattr(cv2, "VideoCapture", lambda path: _Counted(real(path), declared["frames"]))
    _Counted.grabbed = _Counted.retrieved = 0
    return lambda frames: declared.update(frames=frames)


def _video(path: Path, frames: int, size: int = 16) -> Path:
    from videoutil import write_video

    return write_video(path, [np.full((size, size, 3), i % 250, np.uint8) for i in range(frames)])


def test_a_video_is_decoded_once_and_refused_from_its_header_or_at_the_frame_limit(tmp_path, counted):
    from triskele.train.domains.deepfake.video import sample_frames

    long = _video(tmp_path / "long.mp4", 3000)
    sampled = sample_frames(long, 8, decode="all")
    indices, frames, total = sampled.indices, sampled.frames, sampled.total
    assert (indices, total) == ([0, 428, 857, 1285, 1714, 2142, 2571, 2999], 3000)
    assert abs(int(frames[3][0, 0, 0]) - 1285 % 250) <= 5  # frame 1285's grey, up to the codec's error
    assert (_Counted.grabbed, _Counted.retrieved) == (3000, 8), "decoded once, 8 frames converted"

    _Counted.grabbed = 0
    with pytest.raises(ValueError, match=rf"^cannot read video {long}: its header declares 3,000 frames, over "
                                         r"limits.video_frames=1,000 \(--set limits.video_frames=N raises it\)$"):
        sample_frames(long, 8, InputLimits(video_frames=1000), decode="all")
    assert _Counted.grabbed == 0, "refused before decoding"
    with pytest.raises(ValueError, match=rf"{long}: its frames are 16x16 = 256 pixels, over limits.frame_pixels=255"):
        sample_frames(long, 8, InputLimits(frame_pixels=255), decode="all")
    assert _Counted.grabbed == 0

    counted(500)  # a header that understates: decoding stops at the limit
    with pytest.raises(ValueError, match=rf"{long}: it decodes at least 1,001 frames, over limits.video_frames=1,000"):
        sample_frames(long, 8, InputLimits(video_frames=1000), decode="all")
    assert _Counted.grabbed == 1001
    counted(2000)  # within the limit but wrong: sampled again over the 3,000 that decode
    _Counted.grabbed = 0
    assert sample_frames(long, 8, decode="all").indices == indices and _Counted.grabbed == 6000


def test_prepare_lists_a_video_over_the_limit_and_prepares_the_others(tmp_path):
    pytest.importorskip("dlib", reason="face detection needs dlib")
    from triskele.train.domains.deepfake.prepare import prepare_deepfake

    _video(tmp_path / "raw" / "real" / "short.mp4", 12, size=64)
    _video(tmp_path / "raw" / "real" / "long.mp4", 600, size=64)
    summary = prepare_deepfake(tmp_path / "raw", tmp_path / "out", frames=4, progress=False,
                               limits=InputLimits(video_frames=100))
    assert (summary["prepared"], summary["unreadable"]) == (1, 1)
    entries = {e["video"]: e for e in json.loads((tmp_path / "out" / "manifest.json").read_text())["videos"]}
    assert entries["real/short.mp4"]["frames_in_video"] == 12 and entries["real/short.mp4"]["frames_decoded"] <= 12
    assert entries["real/short.mp4"]["reason"].startswith(
        "no face")
    assert entries["real/long.mp4"]["error"].endswith("its header declares 600 frames, over limits.video_frames=100 "
                                                      "(--set limits.video_frames=N raises it)")


RSS_PROBE = """
import sys
from triskele.train.config.schema import InputLimits
from triskele.train.data.images import open_image

def peak():  # kB, since the last reset
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1])

open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from what is resident now
before = peak()
try:
    open_image(sys.argv[1], InputLimits(image_pixels=int(sys.argv[2]))).close()
    print("read")
except ValueError as err:
    print(err)
print((peak() - before) * 1024)
"""
"""Peak RSS growth (bytes) of reading one image in a fresh process (Linux's VmHWM, reset first)."""


def test_an_image_costs_its_allowed_pixels_and_one_over_the_limit_costs_nothing(tmp_path):
    """RSS in a fresh process: a 4000x4000 grey PNG of 16 KB decodes to its 16 MB and no more; an
    8000x8000 RGB PNG of 190 KB (192 MB decoded) is refused from its header at the default limit."""
    small = write_png(tmp_path / "small.png", 4000, 4000)
    big = write_png(tmp_path / "big.png", 8000, 8000, channels=3)
    assert small.stat().st_size < 20_000 and big.stat().st_size < 200_000

    def probe(path: Path, limit: int) -> tuple[str, int]:
        result = subprocess.run([sys.executable, "-c", RSS_PROBE, str(path), str(limit)], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        outcome, grown = result.stdout.splitlines()
        return outcome, int(grown)

    outcome, grown = probe(big, InputLimits().image_pixels)
    assert outcome == (f"cannot read image {big}: its header declares more than 50,000,000 pixels, over "
                       "limits.image_pixels=25,000,000 (--set limits.image_pixels=N raises it)")
    assert grown < 8 << 20, f"refused from the header, yet RSS grew {grown / 2**20:.0f} MiB"
    outcome, grown = probe(small, InputLimits().image_pixels)
    assert outcome == "read" and 15 << 20 < grown < (16 << 20) + (8 << 20), grown
