"""`python -m triskele.train` / `triskele-train`: train a preset on the local (or given) mesh."""

from __future__ import annotations

import argparse
import sys

import jax
from triskele.train.checkpoint import CheckpointSaveError
from triskele.train.config import DEFAULT_PRESET, PRESETS, make_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m triskele.train",
        description="Train a triskele preset. With no arguments: mars-tiny on synthetic data, local devices. "
                    "`python -m triskele.train plan --help`: the mesh planner; "
                    "`python -m triskele.train prepare deepfake --help`: face crops from videos.",
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), metavar="NAME",
                        help=f"named preset (default {DEFAULT_PRESET}); one of {', '.join(PRESETS)}")
    parser.add_argument("--mesh", help="mesh spec, e.g. data=2,fsdp=2,tensor=2, or auto (the planner's pick for "
                        "these devices; on CPU the simplest valid mesh); default: all devices on data")
    parser.add_argument("--workdir", help="run folder: config, checkpoints, metrics (default runs/<preset>)")
    parser.add_argument("--steps", type=int, help="total training steps (run.steps)")
    parser.add_argument("--log-every", type=int, help="log metrics every N steps (run.log_every)")
    parser.add_argument("--seed", type=int, help="run seed: initialization, data order, augmentation (run.seed)")
    parser.add_argument("--data", help="on-disk dataset root (data.path); default: the domain's synthetic data")
    parser.add_argument("--init-from", metavar="PATH",
                        help="pretrained ViT weights for the backbone (model.init_from): timm/Hugging Face "
                             "safetensors, a save_pretrained folder, or a ViT/big_vision .npz")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="YAML or JSON file of overrides (nested or dotted keys); may repeat")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override one config key, e.g. --set optim.lr=3e-4; may repeat")
    parser.add_argument("--print-config", action="store_true",
                        help="print the fully resolved config as YAML (what --config reads back) and exit: no training")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--stop-after-step", type=int, metavar="N",
                        help="checkpoint and stop at global step N (the next run resumes there)")
    multi = parser.add_argument_group("multi-host (JAX multi-controller)")
    multi.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address (else auto-detected)")
    multi.add_argument("--num-processes", type=int, help="processes in the job")
    multi.add_argument("--process-id", type=int, help="this process's index, 0..N-1")
    multi.add_argument("--local-device-ids", help="comma-separated GPU ids this process drives")
    multi.add_argument("--distributed-timeout", type=int, default=60, metavar="S",
                       help="seconds to wait for the coordinator (default 60)")
    multi.add_argument("--heartbeat-timeout", type=int, default=30, metavar="S",
                       help="seconds after which a dead process stops the others (default 30)")
    multi.add_argument("--dcn", help="how many hosts each mesh axis spans, e.g. data=2 (hybrid mesh)")
    multi.add_argument("--local-processes", type=int, metavar="N",
                       help="try multi-host on this machine: start N processes on 127.0.0.1 and wait")
    multi.add_argument("--devices-per-process", type=int, default=1, metavar="K",
                       help="with --local-processes: simulated CPU devices per process (default 1)")
    return parser


def config_from_args(args: argparse.Namespace):
    flags = {"mesh": args.mesh, "run.steps": args.steps, "run.log_every": args.log_every,
             "run.seed": args.seed, "data.path": args.data, "dcn": args.dcn, "model.init_from": args.init_from}
    overrides = [f"{key}={value}" for key, value in flags.items() if value is not None] + list(args.overrides)
    return make_config(args.preset, overrides, files=args.config)


def print_config(args: argparse.Namespace) -> int:
    """What a run of these flags resolves before it builds a mesh (the mesh spec stays as given), as YAML."""
    try:
        config = config_from_args(args)
        from triskele.train.domains import class_names, get_domain
        from triskele.train.pretrained import resolve_norm_eps

        resolve_norm_eps(config)
        domain = get_domain(config.domain)
        if domain.resolve is not None:
            domain.resolve(config)
        config.model.class_names = class_names(config)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(config.to_yaml(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plan"]:
        from triskele.train.tools.plan import main as plan_main

        return plan_main(argv[1:])
    if argv[:1] == ["prepare"]:
        from triskele.train.domains.deepfake.prepare import main as prepare_main

        return prepare_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.print_config:
        return print_config(args)
    if args.local_processes:
        from triskele.train.tools.launch import launch_local

        return launch_local(argv, args.local_processes, args.devices_per_process)
    try:
        config = config_from_args(args)
        from triskele.mesh.distributed import DistributedOptions, initialize

        initialize(DistributedOptions(
            coordinator=args.coordinator, num_processes=args.num_processes, process_id=args.process_id,
            local_device_ids=[int(i) for i in args.local_device_ids.split(",")] if args.local_device_ids else None,
            timeout_s=args.distributed_timeout, heartbeat_timeout_s=args.heartbeat_timeout,
        ))
        from triskele.train.loop import train

        summary = train(config, workdir=args.workdir, progress=not args.no_progress,
                        stop_after_step=args.stop_after_step)
    except ConnectionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (FloatingPointError, CheckpointSaveError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if jax.process_index() != 0:
        return 0
    print(f"{summary.stopped_by}: step {summary.final_step} of {config.run.steps}, last loss {summary.last_loss}")
    if summary.eval_metrics:
        print("eval: " + ", ".join(f"{k}={v:.4f}" for k, v in summary.eval_metrics.items()))
    print(f"checkpoints: {summary.checkpoint_dir}")
    print(f"metrics:     {summary.metrics_file}")
    return 0
