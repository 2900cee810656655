"""Predict throughput: files on disk -> outputs written, beside the model's forward alone on
device-resident batches of the same size, per preset, weight format and batch; and peak memory.

    python bench/predict.py [--preset mars-tiny --preset mars-s16 ...] [--format float32 --format int8 ...]
                            [--batch 1 --batch 32 ...] [--inputs-per-batch 8] [--workdir runs/bench-predict]
                            [--json FILE]

Each preset gets a checkpoint of one training step (its weights are random: throughput does not
depend on them); `bfloat16` is that run with precision=bfloat16; int8/fp8/fp4 are the float32
checkpoint quantized. Inputs are images of the model's input size (one record each: a shelf photo
is one tile; the deepfake frame model reads folders of frames), `--inputs-per-batch` batches'
worth of them, written once.
End to end counts records per second from the first input read to the last output written, the
input pipeline, the device and the writer overlapping; forward only runs the same compiled
`infer` on a batch already on the devices. Peak RSS is this process's, after each row.
"""

from __future__ import annotations

import argparse
import io
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from common import machine, print_table, write_json
from PIL import Image
from triskele.eval.domains import inference_of
from triskele.eval.engine import predict_files
from triskele.eval.model import load_model
from triskele.eval.quantize import quantize_checkpoint
from triskele.train import make_config, train
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.domains import spec_of

PRESETS = ("mars-tiny", "mars-s16", "deepfake-tiny", "merch-tiny", "merch-shelf-tiny")
FORMATS = ("float32", "bfloat16", "int8", "fp8", "fp4")
BATCHES = (1, 8, 32, 128)


def checkpoint(root: Path, preset: str, fmt: str) -> Path:
    """A one-step run of `preset` in `fmt` (made once, reused)."""
    precision = "bfloat16" if fmt == "bfloat16" else "float32"
    workdir = root / f"{preset}-{precision}"
    if not (workdir / "checkpoints").is_dir():
        config = make_config(preset, {"precision": precision, "run.steps": 1, "data.global_batch": 8,
                                      "data.train_size": 8, "data.eval_size": 8, "run.eval_every": 0,
                                      "optim.warmup_steps": 0})
        train(config, workdir, progress=False)
    if fmt in ("int8", "fp8", "fp4"):
        quantized = root / f"{preset}-{fmt}"
        if not (quantized / "checkpoints").is_dir():
            quantize_checkpoint(workdir, fmt, output=quantized)
        return quantized
    return workdir


def write_inputs(folder: Path, meta: dict, count: int) -> None:
    """`count` records' worth of images of the model's input size (deepfake: videos of frames)."""
    if folder.is_dir():
        return
    rng = np.random.default_rng(0)
    size, channels = meta["image_size"], meta["channels"]
    per_video = meta["options"].get("frames_per_video", 1) if meta["domain"] == "deepfake" else 1
    for i in range(max(1, count // per_video)):
        target = folder / f"v{i:05d}" if per_video > 1 else folder
        target.mkdir(parents=True, exist_ok=True)
        for j in range(per_video):
            pixels = rng.integers(0, 255, (size, size) if channels == 1 else (size, size, channels), np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="PNG")
            write_atomically(target / f"{i:05d}_{j:03d}.png", buffer.getvalue())


def forward_only(model, records: np.ndarray, repeats: int = 5) -> float:
    """Records per second of the compiled `infer` on a batch already on the devices."""
    import jax

    handle = model.dispatch(records)
    jax.block_until_ready(handle)
    began = time.perf_counter()
    for _ in range(repeats):
        handle = model.dispatch(records)
    jax.block_until_ready(handle)
    return repeats * len(records) / (time.perf_counter() - began)


def row(root: Path, preset: str, fmt: str, batch: int, inputs_per_batch: int) -> dict:
    model = load_model(checkpoint(root, preset, fmt), batch=batch)
    io = inference_of(spec_of(model.meta["domain"], model.meta.get("options", {}))).predict_io(model.meta, {}, None)
    records = batch * inputs_per_batch
    inputs = root / "inputs" / f"{preset}-{records}"
    write_inputs(inputs, model.meta, records)
    out = root / "out"
    shutil.rmtree(out, ignore_errors=True)
    predict_files(model, io, inputs, out, progress=False)  # compiles, warms the caches
    shutil.rmtree(out)
    summary = predict_files(model, io, inputs, out, progress=False)
    shape = (batch, *([model.meta["frames"]] if model.meta["frames"] > 1 else []), model.meta["image_size"],
             model.meta["image_size"], model.meta["channels"])
    forward = forward_only(model, np.random.default_rng(1).random(shape, dtype=np.float32))
    end_to_end = summary["records_per_sec"]
    return {"preset": preset, "format": fmt, "batch": batch, "records": summary["records"],
            "end_to_end": end_to_end, "forward_only": forward, "ratio": end_to_end / forward,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", help=f"default: {', '.join(PRESETS)}")
    parser.add_argument("--format", action="append", help=f"default: {', '.join(FORMATS)}")
    parser.add_argument("--batch", action="append", type=int, help=f"default: {', '.join(map(str, BATCHES))}")
    parser.add_argument("--inputs-per-batch", type=int, default=8)
    parser.add_argument("--workdir", default="runs/bench-predict")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    root = Path(args.workdir)
    rows = [row(root, preset, fmt, batch, args.inputs_per_batch)
            for preset in args.preset or PRESETS for fmt in args.format or FORMATS for batch in args.batch or BATCHES]
    print(f"predict records/s, {machine()['device_kind']} x {machine()['devices']}")
    print_table(rows, ["preset", "format", "batch", "records", "end_to_end", "forward_only", "ratio", "peak_rss_mb"])
    write_json(args.json, {"machine": machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
