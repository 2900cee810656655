"""`python -m triskele.eval` (evaluate a checkpoint) and its commands: predict, gallery, quantize,
export (a jax.export serving artifact) and export-weights (the backbone as timm safetensors)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import jax
from triskele.eval.model import INFERENCE_BATCH_PER_DEVICE


def _common(parser: argparse.ArgumentParser, workdir_required: bool = True) -> None:
    parser.add_argument("--workdir", required=workdir_required, help="the training run's folder (holds checkpoints/)")
    parser.add_argument("--mesh", help="mesh spec to run on, or auto (evaluation: the planner's pick); default: "
                        "all local devices on data")
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
    parser.add_argument("--input", required=True,
                        help="a folder (searched recursively), a glob in quotes, or a .txt file of paths")
    parser.add_argument("--output", required=True, help="folder for the predictions")
    parser.add_argument("--exported", metavar="FILE", help="use this exported model instead of a checkpoint "
                                                           "(merch: --workdir still finds the gallery)")
    parser.add_argument("--batch", type=int, help=f"records per batch (default {INFERENCE_BATCH_PER_DEVICE} per "
                                                  "device on data x fsdp)")
    parser.add_argument("--workers", type=int, default=0, help="input worker processes (default 0: threads)")
    parser.add_argument("--threads", type=int, default=4, help="input threads when --workers is 0 (default 4)")
    parser.add_argument("--prefetch", type=int, default=8, help="inputs read ahead of the model (default 8)")
    parser.add_argument("--overwrite", action="store_true", help="predict inputs whose outputs exist again")
    parser.add_argument("--stride", type=int, help="mars: sliding-window stride in pixels (default 2/3 window)")
    parser.add_argument("--tta", choices=["flip"], help="mars: average with the mirrored pass")
    parser.add_argument("--overlay", action="store_true", help="mars: also write NAME.overlay.png")
    parser.add_argument("--save-faces", metavar="DIR", help="deepfake: keep the face crops found in videos here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    _distributed(parser)

    def run(a):
        from triskele.eval.evaluate import predict

        _start_distributed(a)
        summary = predict(a.workdir, a.input, a.output, a.mesh, a.step, a.exported, batch=a.batch,
                          overwrite=a.overwrite, workers=a.workers, threads=a.threads, prefetch=a.prefetch,
                          progress=not a.no_progress, stride=a.stride, tta=a.tta, overlay=a.overlay,
                          save_faces=a.save_faces)
        return summary, 1 if summary["unreadable"] else 0

    return run


def _distributed(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("several processes (each predicts its share of the inputs)")
    group.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address (else auto-detected)")
    group.add_argument("--num-processes", type=int, help="processes in the job")
    group.add_argument("--process-id", type=int, help="this process's index, 0..N-1")


def _start_distributed(args) -> None:
    from triskele.mesh.distributed import DistributedOptions, initialize

    initialize(DistributedOptions(coordinator=args.coordinator, num_processes=args.num_processes,
                                  process_id=args.process_id))


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
    except ConnectionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    result, code = result if isinstance(result, tuple) else (result, 0)
    if jax.process_index() == 0:
        print(json.dumps(result, indent=2))
    return code
