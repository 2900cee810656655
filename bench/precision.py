"""mars-tiny in float32, bfloat16 and fp8, and the float32 checkpoint quantized to int8, fp8 and fp4:
final training loss, test mIoU, weight bytes and step time, one table.

    python bench/precision.py [--steps 300] [--set KEY=VALUE ...] [--workdir runs/bench-precision] [--json FILE]

Each precision trains with the same seed on the local devices (one CPU here); the step time is the
median over the logging windows after the first (which holds the compilation). The quantized rows
evaluate the float32 run's checkpoint with its block kernels stored in that format.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

from common import machine, print_table, write_json
from triskele.eval.quantize import quantize_checkpoint
from triskele.eval.report import evaluate_checkpoint
from triskele.train import make_config, train


def training_row(workdir: Path, precision: str, overrides: list[str], steps: int) -> dict:
    config = make_config("mars-tiny", [*overrides, f"precision={precision}", f"run.steps={steps}",
                                       "run.log_every=20", f"run.eval_every={steps}"])
    summary = train(config, workdir, progress=False)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    logs = [r for r in records if "loss" in r]
    step_s = statistics.median(config.data.global_batch / r["images_per_sec"] for r in logs[1:])
    report = evaluate_checkpoint(workdir)
    return {"run": precision, "final_loss": logs[-1]["loss_mean"], "miou": report["metrics"]["miou"],
            "weight_bytes": report["weight_bytes"], "step_ms": 1e3 * step_s, "train_miou": summary.eval_metrics["miou"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--workdir", default="runs/bench-precision")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    root = Path(args.workdir)
    shutil.rmtree(root, ignore_errors=True)
    rows = [training_row(root / precision, precision, args.set, args.steps)
            for precision in ("float32", "bfloat16", "fp8")]
    for fmt in ("int8", "fp8", "fp4"):
        quantized = quantize_checkpoint(root / "float32", fmt, output=root / f"float32-{fmt}")
        report = evaluate_checkpoint(quantized["output"])
        rows.append({"run": f"float32 -> {fmt} weights", "miou": report["metrics"]["miou"],
                     "weight_bytes": report["weight_bytes"],
                     "kernel_ratio": quantized["kernel_bytes_float32"] / quantized["kernel_bytes_with_scales"]})
    print(f"mars-tiny, {args.steps} steps, seed 0, {machine()['device_kind']} ({', '.join(args.set) or 'preset'})")
    print_table(rows, ["run", "final_loss", "miou", "weight_bytes", "kernel_ratio", "step_ms"])
    write_json(args.json, {"steps": args.steps, "overrides": args.set, "machine": machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
