"""`python -m triskele.eval` (evaluate a checkpoint) and its commands: predict, gallery, quantize,
export (a jax.export serving artifact) and export-weights (the backbone as timm safetensors)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any


def _common(parser: argparse.ArgumentParser, workdir_required: bool = True) -> None:
    parser.add_argument("--workdir", required=workdir_required, help="the training run's folder (holds checkpoints/)")
    parser.add_argument("--mesh", help="mesh spec to run on (default: all local devices on data)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")


def _evaluate(parser):
    parser.add_argument("--data", help="on-disk dataset (default: the run's own data)")
    parser.add_argument("--split", default="test", help="split to evaluate (default test)")
    parser.add_argument("--holdout", metavar="METHOD",
                        help="deepfake: evaluate only this manipulation method's fakes (with all reals)")

    def run(a):
        from triskele.eval.evaluate import evaluate_checkpoint

        return evaluate_checkpoint(a.workdir, a.mesh, a.data, a.split, a.step, a.holdout)

    return run


def _predict(parser):
    parser.add_argument("--input", required=True, help="folder of input images")
    parser.add_argument("--output", required=True, help="folder for the predictions")
    parser.add_argument("--exported", metavar="FILE", help="use this exported model instead of a checkpoint "
                                                           "(merch: --workdir still finds the gallery)")

    def run(a):
        from triskele.eval.evaluate import predict

        return predict(a.workdir, a.input, a.output, a.mesh, a.step, a.exported)

    return run


def _gallery(parser):
    parser.add_argument("--input", required=True, help="folder of <sku>/ folders of reference images")

    def run(a):
        from triskele.eval.evaluate import build_gallery

        return build_gallery(a.workdir, a.input, a.mesh, a.step)

    return run


def _quantize(parser):
    parser.add_argument("--format", required=True, help="int8, fp8 or fp4")
    parser.add_argument("--output", help="folder for the copy (default: WORKDIR-FORMAT)")

    def run(a):
        from triskele.eval.quantize import quantize_checkpoint

        return quantize_checkpoint(a.workdir, a.format, a.step, a.output, a.mesh)

    return run


def _export(parser):
    parser.add_argument("--output", required=True, help="the file to write (FILE.json is written beside it)")
    parser.add_argument("--batch", default="dynamic", help="the batch size, or 'dynamic' (default)")
    parser.add_argument("--platforms", help="comma-separated, e.g. cpu,cuda (default: this machine's)")

    def run(a):
        from triskele.eval.export import export_model

        return export_model(a.workdir, a.output, a.batch, a.step, a.platforms)

    return run


def _export_weights(parser):
    parser.add_argument("--format", default="timm", help="timm (default)")
    parser.add_argument("--output", required=True, help="the .safetensors file to write")

    def run(a):
        from triskele.eval.export_weights import export_weights

        return export_weights(a.workdir, a.format, a.output, a.step, a.mesh)

    return run


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Callable[[Any], Any]]]] = {
    "predict": ("Predict every image of a folder with a checkpoint or an exported model.", _predict),
    "gallery": ("merch: embed reference images into WORKDIR/gallery/index.npz.", _gallery),
    "quantize": ("Write a weight-quantized copy of a checkpoint for inference.", _quantize),
    "export": ("Serialise the inference function with jax.export (weights included) for serving.", _export),
    "export-weights": ("Write the trained backbone as a timm safetensors file.", _export_weights),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv[:1] and argv[0] in COMMANDS else None
    description, build = COMMANDS[command] if command else (
        "Evaluate a checkpoint; writes WORKDIR/eval/<step>/. Commands: " + ", ".join(COMMANDS), _evaluate)
    parser = argparse.ArgumentParser(prog="python -m triskele.eval" + (f" {command}" if command else ""),
                                     description=description)
    _common(parser, workdir_required=command != "predict")
    run = build(parser)
    args = parser.parse_args(argv[1:] if command else argv)
    try:
        result = run(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0
