"""Weight quantization for inference: int8, fp8 and nibble-packed fp4 (NVFP4) checkpoints."""

import json

import ml_dtypes
import numpy as np
import pytest
from PIL import Image
from triskele.eval.cli import main as eval_main
from triskele.eval.quantize import quantize_checkpoint
from triskele.eval.report import evaluate_checkpoint
from triskele.models.quantize import E2M1_VALUES, dequantize, quantize, unpack_fp4
from triskele.train import make_config, train
from triskele.train.config.migrations import config_from_dict

pytestmark = pytest.mark.xdist_group("mars_precision_runs")  # shares a session fixture: one worker runs them

MIOU_TOLERANCE = {"int8": 0.02, "fp8": 0.02, "fp4": 0.05}


def test_fp4_nibble_packing_is_bit_exact():
    rng = np.random.default_rng(0)
    every_byte = np.arange(256, dtype=np.uint8).reshape(128, 2)
    values = np.asarray(unpack_fp4(every_byte))
    low, high = values[0::2], values[1::2]
    np.testing.assert_array_equal(low, E2M1_VALUES[every_byte & 0xF])
    np.testing.assert_array_equal(high, E2M1_VALUES[every_byte >> 4])
    # The codes e2m1 gives (ml_dtypes' float4_e2m1fn) survive packing and unpacking exactly.
    w = rng.normal(size=(2, 64, 24)).astype(np.float32)
    stored = quantize(w, "fp4", lead=1, num_in=1)
    assert stored["codes"].shape == (2, 32, 24) and stored["codes"].dtype == np.uint8
    for layer in range(2):
        scale = (stored["block_scale"][layer].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
                 * stored["global_scale"][layer])
        effective = np.repeat(np.where(scale > 0, scale, 1.0), 16, axis=0)
        expected = np.clip(w[layer] / effective, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(unpack_fp4(stored["codes"][layer])), expected)


# Relative RMS error measured on this kernel (seed 1) with the right rounding, and with the nearest
# wrong one; each bound lies between the two, nearer the right one than the gap:
#   int8 0.0059 (a bound of 2^-7);
#   fp8 e4m3 0.0250, rounded through e5m2 0.0504 (bound 0.035);
#   fp4 with a scale per block of 16 inputs 0.0921, one scale per output channel 0.1050 (bound 0.098).
@pytest.mark.parametrize("fmt, bound", [("int8", 2**-7), ("fp8", 0.035), ("fp4", 0.098)])
def test_dequantized_kernels_are_close_to_the_original(fmt, bound):
    w = np.random.default_rng(1).normal(size=(64, 4, 16)).astype(np.float32)  # a query kernel
    stored = quantize(w, fmt, lead=0, num_in=1)
    back = np.asarray(dequantize(stored, fmt, (64,), (4, 16), np.float32))
    assert back.shape == w.shape
    assert np.linalg.norm(back - w) / np.linalg.norm(w) < bound


def reference_fp8(m: np.ndarray) -> np.ndarray:
    """e4m3fn with one scale per output channel, amax / 448 (the format as documented, by hand)."""
    scale = np.abs(m).max(axis=0, keepdims=True) / 448
    return np.clip(m / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale


def reference_nvfp4(m: np.ndarray) -> np.ndarray:
    """NVFP4 by hand: a float32 global scale amax / (6 * 448), an e4m3 scale per block of 16 inputs of
    each output channel (the block's amax / 6, in global-scale units), e2m1 values."""
    k, n = m.shape
    global_scale = np.abs(m).max() / (6 * 448)
    out = np.empty_like(m)
    for block in range(k // 16):
        rows = slice(16 * block, 16 * block + 16)
        for col in range(n):
            x = m[rows, col]
            code = np.float32(np.abs(x).max() / 6 / global_scale).astype(ml_dtypes.float8_e4m3fn)
            scale = np.float32(code) * global_scale
            out[rows, col] = np.clip(x / scale, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32) * scale
    return out


@pytest.mark.parametrize("fmt, reference", [("fp8", reference_fp8), ("fp4", reference_nvfp4)])
def test_dequantized_kernels_equal_the_formats_rounding_by_hand(fmt, reference):
    """Every weight read back equals the format's own rounding of it, computed here from the format's
    definition (not from the stored scales): e5m2 codes or one fp4 scale per channel would differ."""
    w = np.random.default_rng(2).normal(size=(64, 48)).astype(np.float32) * np.linspace(0.1, 3, 48)
    back = np.asarray(dequantize(quantize(w, fmt, lead=0, num_in=1), fmt, (64,), (48,), np.float32))
    np.testing.assert_allclose(back, reference(w), rtol=1e-6, atol=0)


def stored_bytes(stored):
    return sum(v.nbytes for v in stored.values())


@pytest.mark.parametrize("width", [384, 768])
def test_kernels_with_their_scales_shrink_at_vit_widths(width):
    """int8/fp8 store K bytes + 4 per output channel, fp4 K/2 + K/16 (+ 4 per kernel): ViT-S and B."""
    rng = np.random.default_rng(2)
    shapes = [(width, width), (width, 4 * width), (4 * width, width)]  # attention output, MLP up and down
    kernels = [rng.normal(size=shape) for shape in shapes]
    float_bytes = sum(k.astype(np.float32).nbytes for k in kernels)
    for fmt, least in (("int8", 3.9), ("fp8", 3.9), ("fp4", 6.5)):
        quantized = sum(stored_bytes(quantize(k, fmt, 0, 1)) for k in kernels)
        assert float_bytes / quantized >= least, (fmt, float_bytes / quantized)


@pytest.fixture(scope="module")
def quantized(mars_precision_runs, tmp_path_factory):
    source, _ = mars_precision_runs["float32"]
    out = tmp_path_factory.mktemp("quantized")
    reference = evaluate_checkpoint(source, mesh="data=8")
    runs = {fmt: quantize_checkpoint(source, fmt, output=out / fmt, mesh="data=8") for fmt in MIOU_TOLERANCE}
    return source, reference, runs


@pytest.mark.parametrize("fmt", list(MIOU_TOLERANCE))
def test_quantized_checkpoint_evaluates_close_to_float32(fmt, quantized, devices):
    _, reference, runs = quantized
    report = evaluate_checkpoint(runs[fmt]["output"], mesh="data=8")
    assert report["format"] == fmt and reference["format"] == "float32"
    assert abs(report["metrics"]["miou"] - reference["metrics"]["miou"]) < MIOU_TOLERANCE[fmt]
    assert report["weight_bytes"] == runs[fmt]["weight_bytes"] < reference["weight_bytes"]
    summary = runs[fmt]
    # The kernels' codes take 1 byte (int8, fp8) or half a byte (fp4) per float32 weight.
    least = 6.5 if fmt == "fp4" else 3.9
    assert summary["kernel_bytes_float32"] / summary["kernel_bytes"] >= least
    # With their scales: mars-tiny's kernels have 64 inputs (and 256 for MLP down), so the float32
    # scale per output channel costs 4/64 of a byte per weight: 3.82x for int8 and fp8, 7.10x for fp4.
    expected = {"int8": 1572864 / 411648, "fp8": 1572864 / 411648, "fp4": 1572864 / 221376}[fmt]
    assert summary["kernel_bytes_float32"] / summary["kernel_bytes_with_scales"] == pytest.approx(expected)


def test_a_quantized_checkpoint_restores_on_another_mesh(quantized, devices):
    _, _, runs = quantized
    a = evaluate_checkpoint(runs["fp4"]["output"], mesh="data=8")
    b = evaluate_checkpoint(runs["fp4"]["output"], mesh="fsdp=2,tensor=4")
    assert b["mesh"]["tensor"] == 4
    assert a["metrics"]["miou"] == pytest.approx(b["metrics"]["miou"], abs=1e-4)


def test_predict_and_the_cli_load_a_quantized_checkpoint(quantized, tmp_path, capsys):
    _, _, runs = quantized
    inputs = tmp_path / "in"
    inputs.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40), np.uint8)).save(inputs / "a.png")
    assert eval_main(["predict", "--workdir", runs["int8"]["output"], "--input", str(inputs),
                      "--output", str(tmp_path / "out"), "--mesh", "data=8"]) == 0
    mask = np.asarray(Image.open(tmp_path / "out" / "a.png"))
    assert mask.shape == (40, 40) and set(np.unique(mask)) <= {0, 1, 2, 3}
    capsys.readouterr()
    assert eval_main(["--workdir", runs["int8"]["output"], "--mesh", "data=8"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "int8"


def test_quantize_cli_writes_a_copy_and_refuses_bad_input(quantized, tmp_path, capsys):
    source, _, runs = quantized
    code = eval_main(["quantize", "--workdir", str(source), "--format", "fp8", "--output", str(tmp_path / "q"),
                      "--mesh", "data=8"])
    assert code == 0, capsys.readouterr().err
    written = json.loads(capsys.readouterr().out)
    assert written["format"] == "fp8" and (tmp_path / "q" / "checkpoints" / "300").is_dir()
    assert config_from_dict(json.loads((tmp_path / "q" / "config.json").read_text())).model.quantization == "fp8"
    assert eval_main(["quantize", "--workdir", str(source), "--format", "int4"]) == 2
    assert "unknown quantization format 'int4'; choose one of int8, fp8, fp4" in capsys.readouterr().err
    assert eval_main(["quantize", "--workdir", runs["int8"]["output"], "--format", "fp4"]) == 2
    assert "already holds a int8-quantized checkpoint" in capsys.readouterr().err
    assert eval_main(["quantize", "--workdir", str(source), "--format", "fp8", "--output", str(tmp_path / "q")]) == 2
    assert "already holds checkpoints/" in capsys.readouterr().err


def test_training_a_quantized_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="quantized checkpoint is for evaluation and prediction"):
        train(make_config("mars-tiny", {"model.quantization": "int8"}), tmp_path)
