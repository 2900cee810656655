"""The first-GPU check, one script: training step time, MFU and peak memory of mars-b16 and mars-l16
in bfloat16 and fp8 on one GPU beside the planner's prediction for the same run; the FP8 GEMM calls
(cuBLASLt) in the compiled fp8 step; predict images/s per weight format beside the roofline.
Writes gpu.json and gpu.md (one Markdown table per part) to --out.

    bash bench/gpu.sh [--out DIR]          # on the GPU machine (installs .whl/ wheels first)
    bash bench/gpu.sh --cpu --out DIR      # the same on tiny shapes, on CPU (the test suite runs it)

On CPU (or a device the GPU table does not know) predictions use the H200 entry and say so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import jax
import numpy as np
from common import machine

GPU_RUNS = {"presets": ("mars-b16", "mars-l16"), "precisions": ("bfloat16", "fp8"), "batch": 256, "steps": 10,
            "formats": ("bfloat16", "int8", "fp8", "fp4"), "predict_batches": (1, 64), "predict_preset": "mars-l16"}
CPU_RUNS = {"presets": ("mars-tiny",), "precisions": ("bfloat16", "fp8"), "batch": 8, "steps": 2,
            "formats": ("int8",), "predict_batches": (1,), "predict_preset": "mars-tiny",
            "overrides": ("model.image_size=32", "data.train_size=16", "data.eval_size=8")}
FP8_GEMM = re.compile(r'custom_call_target="__cublas\$lt\$matmul\$f8')


def _gpu():
    from triskele.mesh.perf.hardware import GPUS, gpu_of_device

    known = gpu_of_device(jax.devices()[0])
    return (known, "") if known else (GPUS["h200"], " (no GPU here: predictions for H200)")


def training_row(preset: str, precision: str, plan: dict) -> dict:
    from triskele.mesh import host_to_global, process_rows
    from triskele.mesh.perf.formulas import train_flops
    from triskele.mesh.perf.planner import best_for_mesh
    from triskele.mesh.spec import MeshSpec
    from triskele.train.config.overrides import make_config
    from triskele.train.data.pipeline import TrainStepLoader
    from triskele.train.run import prepare
    from triskele.train.tools.plan_inputs import plan_inputs
    from triskele.train.tools.step_analysis import compile_train_step, model_shape

    config = make_config(preset, [f"precision={precision}", f"data.global_batch={plan['batch']}", "mesh=data=1",
                                  *plan.get("overrides", ())])
    parts = prepare(config)
    source = parts.domain.open_split(config, "train")
    batch = host_to_global(TrainStepLoader(source, plan["batch"], 0, process_rows(parts.mesh, plan["batch"]))(0),
                           parts.mesh, plan["batch"])
    compiled, compile_s = compile_train_step(parts, batch)
    fp8_gemms = len(FP8_GEMM.findall(compiled.as_text()))
    state = parts.init_state()
    with jax.set_mesh(parts.mesh):
        for _ in range(2):
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
        began = time.perf_counter()
        for _ in range(plan["steps"]):
            state, _ = compiled(state, batch)
        jax.block_until_ready(state)
    step_s = (time.perf_counter() - began) / plan["steps"]
    gpu, note = _gpu()
    compute = {"float32": "float32", "fp8": "fp8"}.get(precision, "bfloat16")
    peak = gpu.peak_flops[compute]
    flops = train_flops(model_shape(parts), plan["batch"]).total
    inputs = plan_inputs(config, gpu, 1)
    predicted = best_for_mesh(inputs, MeshSpec(data=1), any_fit=True)
    stats = jax.devices()[0].memory_stats() or {}
    return {"preset": preset, "precision": precision, "batch": plan["batch"], "compile_s": compile_s,
            "step_ms": 1e3 * step_s, "predicted_step_ms": 1e3 * predicted.step_s, "mfu": flops / step_s / peak,
            "predicted_mfu": predicted.mfu, "peak_memory_GB": stats.get("peak_bytes_in_use", 0) / 1e9,
            "predicted_memory_GB": predicted.memory.total / 1e9, "fp8_gemm_calls": fp8_gemms, "gpu": gpu.name + note}


def predict_rows(plan: dict, workdir: Path) -> list[dict]:
    from predict import checkpoint, forward_only
    from triskele.eval.model import load_model
    from triskele.mesh.perf.roofline import roofline
    from triskele.train.tools.step_analysis import abstract_params, model_shape

    gpu, note = _gpu()
    rows = []
    for fmt in plan["formats"]:
        for batch in plan["predict_batches"]:
            model = load_model(checkpoint(workdir, plan["predict_preset"], fmt), batch=batch)
            meta = model.meta
            shape = (batch, meta["image_size"], meta["image_size"], meta["channels"])
            measured = forward_only(model, np.random.default_rng(1).random(shape, dtype=np.float32))
            weights = float(sum(leaf.size for leaf in jax.tree.leaves(abstract_params(model.parts))))
            predicted = roofline(model_shape(model.parts), weights, gpu, fmt, batch)
            rows.append({"preset": plan["predict_preset"], "format": fmt, "batch": batch, "images_per_sec": measured,
                         "roofline_images_per_sec": predicted.images_per_sec, "bound": predicted.bound,
                         "gpu": gpu.name + note})
    return rows


def markdown(title: str, rows: list[dict]) -> str:
    if not rows:
        return f"### {title}\n\n(none)\n"
    columns = list(rows[0])

    def cell(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from triskele.train.bookkeeping.files import write_atomically

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on CPU (what the tests run)")
    parser.add_argument("--out", default="runs/bench-gpu")
    args = parser.parse_args(argv)
    plan = CPU_RUNS if args.cpu else GPU_RUNS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    training = [training_row(p, precision, plan) for p in plan["presets"] for precision in plan["precisions"]]
    predicting = predict_rows(plan, out / "checkpoints")
    result = {"machine": machine(), "mode": "cpu" if args.cpu else "gpu", "training": training,
              "predict": predicting, "seconds": time.perf_counter() - began}
    report = markdown("Training step, one GPU", training) + "\n" + markdown("Predict, forward only", predicting)
    write_atomically(out / "gpu.json", (json.dumps(result, indent=2, default=float) + "\n").encode())
    write_atomically(out / "gpu.md", report.encode())
    print(report)
    print(f"wrote {out / 'gpu.json'} and {out / 'gpu.md'} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
