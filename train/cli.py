"""`python -m triskele.train` / `triskele-train`: train a preset on the local (or given) mesh."""

from __future__ import annotations

import argparse
import sys

from triskele.train.config import DEFAULT_PRESET, PRESETS, make_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m triskele.train",
        description="Train a triskele preset. With no arguments: mars-tiny on synthetic data, local devices.",
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), metavar="NAME",
                        help=f"named preset (default {DEFAULT_PRESET}); one of {', '.join(PRESETS)}")
    parser.add_argument("--mesh", help="mesh spec, e.g. data=2,fsdp=2,tensor=2 (default: all devices on data)")
    parser.add_argument("--workdir", help="run folder: config, checkpoints, metrics (default runs/<preset>)")
    parser.add_argument("--steps", type=int, help="total training steps (run.steps)")
    parser.add_argument("--log-every", type=int, help="log metrics every N steps (run.log_every)")
    parser.add_argument("--seed", type=int, help="run seed: initialization, data order, augmentation (run.seed)")
    parser.add_argument("--data", help="on-disk dataset root (data.path); default: the domain's synthetic data")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="YAML or JSON file of overrides (nested or dotted keys); may repeat")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override one config key, e.g. --set optim.lr=3e-4; may repeat")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def config_from_args(args: argparse.Namespace):
    flags = {"mesh": args.mesh, "run.steps": args.steps, "run.log_every": args.log_every,
             "run.seed": args.seed, "data.path": args.data}
    overrides = [f"{key}={value}" for key, value in flags.items() if value is not None] + list(args.overrides)
    return make_config(args.preset, overrides, files=args.config)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        from triskele.train.loop import train

        summary = train(config, workdir=args.workdir, progress=not args.no_progress)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{summary.stopped_by}: step {summary.final_step} of {config.run.steps}, last loss {summary.last_loss}")
    if summary.eval_metrics:
        print("eval: " + ", ".join(f"{k}={v:.4f}" for k, v in summary.eval_metrics.items()))
    print(f"checkpoints: {summary.checkpoint_dir}")
    print(f"metrics:     {summary.metrics_file}")
    return 0
