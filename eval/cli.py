"""`python -m triskele.eval` (evaluate a checkpoint), and its `predict`, `gallery`, `quantize` and
`export-weights` commands."""

from __future__ import annotations

import argparse
import json
import sys


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True, help="the training run's folder (holds checkpoints/)")
    parser.add_argument("--mesh", help="mesh spec to evaluate on (default: all local devices on data)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from triskele.eval.evaluate import build_gallery, evaluate_checkpoint, predict
    from triskele.eval.export_weights import export_weights
    from triskele.eval.quantize import quantize_checkpoint

    if argv[:1] == ["gallery"]:
        parser = argparse.ArgumentParser(prog="python -m triskele.eval gallery",
                                         description="merch: embed reference images into WORKDIR/gallery/index.npz.")
        _common(parser)
        parser.add_argument("--input", required=True, help="folder of <sku>/ folders of reference images")
        args = parser.parse_args(argv[1:])
        run = lambda: build_gallery(args.workdir, args.input, args.mesh, args.step)
    elif argv[:1] == ["export-weights"]:
        parser = argparse.ArgumentParser(prog="python -m triskele.eval export-weights",
                                         description="Write the trained backbone as a timm safetensors file.")
        _common(parser)
        parser.add_argument("--format", default="timm", help="timm (default)")
        parser.add_argument("--output", required=True, help="the .safetensors file to write")
        args = parser.parse_args(argv[1:])
        run = lambda: export_weights(args.workdir, args.format, args.output, args.step, args.mesh)
    elif argv[:1] == ["quantize"]:
        parser = argparse.ArgumentParser(prog="python -m triskele.eval quantize",
                                         description="Write a weight-quantized copy of a checkpoint for inference.")
        _common(parser)
        parser.add_argument("--format", required=True, help="int8, fp8 or fp4")
        parser.add_argument("--output", help="folder for the copy (default: WORKDIR-FORMAT)")
        args = parser.parse_args(argv[1:])
        run = lambda: quantize_checkpoint(args.workdir, args.format, args.step, args.output, args.mesh)
    elif argv[:1] == ["predict"]:
        parser = argparse.ArgumentParser(prog="python -m triskele.eval predict",
                                         description="Predict every image of a folder with a checkpoint.")
        _common(parser)
        parser.add_argument("--input", required=True, help="folder of input images")
        parser.add_argument("--output", required=True, help="folder for the predictions")
        args = parser.parse_args(argv[1:])
        run = lambda: predict(args.workdir, args.input, args.output, args.mesh, args.step)
    else:
        parser = argparse.ArgumentParser(prog="python -m triskele.eval",
                                         description="Evaluate a checkpoint; writes WORKDIR/eval/<step>/.")
        _common(parser)
        parser.add_argument("--data", help="on-disk dataset (default: the run's own data)")
        parser.add_argument("--split", default="test", help="split to evaluate (default test)")
        parser.add_argument("--holdout", metavar="METHOD",
                            help="deepfake: evaluate only this manipulation method's fakes (with all reals)")
        args = parser.parse_args(argv)
        run = lambda: evaluate_checkpoint(args.workdir, args.mesh, args.data, args.split, args.step, args.holdout)
    try:
        result = run()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0
