"""`python -m triskele.train` / `triskele-train`: train a preset on the local (or given) mesh."""

from __future__ import annotations

import argparse
import functools
import sys

from triskele.train.bookkeeping.stop import INTERRUPTED_EXIT
from triskele.train.commands import Command, LazyCommands, add_coordinator_flags, bounded, folder, run_command_line
from triskele.train.config.overrides import make_config
from triskele.train.config.presets import DEFAULT_PRESET, PRESETS


def add_train_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), metavar="NAME",
                        help=f"named preset (default {DEFAULT_PRESET}); one of {', '.join(PRESETS)}")
    parser.add_argument("--mesh", help="mesh spec, e.g. data=2,fsdp=2,tensor=2, or auto (the planner's pick for "
                        "these devices; on CPU the simplest valid mesh); default: all devices on data")
    parser.add_argument("--workdir", type=folder,
                        help="run folder: config, checkpoints, metrics (default runs/<preset>)")
    parser.add_argument("--steps", type=bounded(int, 1), help="total training steps (run.steps)")
    parser.add_argument("--log-every", type=bounded(int, 1), help="log metrics every N steps (run.log_every)")
    parser.add_argument("--seed", type=bounded(int, 0),
                        help="run seed: initialization, data order, augmentation (run.seed)")
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
    parser.add_argument("--stop-after-step", type=bounded(int, 1), metavar="N",
                        help="checkpoint and stop at global step N (the next run resumes there)")
    multi = parser.add_argument_group("multi-host (JAX multi-controller)")
    add_coordinator_flags(multi)
    multi.add_argument("--local-device-ids", help="comma-separated GPU ids this process drives")
    multi.add_argument("--distributed-timeout", type=bounded(int, 1), default=60, metavar="S",
                       help="seconds to wait for the coordinator (default 60)")
    multi.add_argument("--heartbeat-timeout", type=bounded(int, 1), default=30, metavar="S",
                       help="seconds after which a dead process stops the others (default 30)")
    multi.add_argument("--dcn", help="how many hosts each mesh axis spans, e.g. data=2 (hybrid mesh)")
    multi.add_argument("--local-processes", type=bounded(int, 1), metavar="N",
                       help="try multi-host on this machine: start N processes on 127.0.0.1 and wait")
    multi.add_argument("--devices-per-process", type=bounded(int, 1), default=1, metavar="K",
                       help="with --local-processes: simulated CPU devices per process (default 1)")
    return parser


def config_from_args(args: argparse.Namespace):
    flags = {"mesh": args.mesh, "run.steps": args.steps, "run.log_every": args.log_every,
             "run.seed": args.seed, "data.path": args.data, "dcn": args.dcn, "model.init_from": args.init_from}
    overrides = [f"{key}={value}" for key, value in flags.items() if value is not None] + list(args.overrides)
    return make_config(args.preset, overrides, files=args.config)


def print_config(args: argparse.Namespace) -> int:
    """What a run of these flags resolves before it builds a mesh (the mesh spec stays as given), as YAML."""
    from triskele.train.domains import resolve_from_data
    from triskele.train.weights.pretrained import resolve_norm_eps

    config = config_from_args(args)
    resolve_norm_eps(config)
    resolve_from_data(config)
    print(config.to_yaml(), end="")
    return 0


def _train(parser: argparse.ArgumentParser, argv: list[str]):
    """Training; `argv`, the command line itself, is what the local launcher starts copies of."""
    add_train_flags(parser)

    def run(args: argparse.Namespace) -> int:
        if args.print_config:
            return print_config(args)
        if args.local_processes:
            from triskele.train.tools.launch import launch_local

            return launch_local(argv, args.local_processes, args.devices_per_process)
        config = config_from_args(args)
        from triskele.mesh.distributed import DistributedOptions, initialize

        initialize(DistributedOptions(
            coordinator=args.coordinator, coordinator_bind=args.coordinator_bind, num_processes=args.num_processes,
            process_id=args.process_id,
            local_device_ids=[int(i) for i in args.local_device_ids.split(",")] if args.local_device_ids else None,
            timeout_s=args.distributed_timeout, heartbeat_timeout_s=args.heartbeat_timeout,
        ))
        import jax
        from triskele.train.loop import train

        summary = train(config, workdir=args.workdir, progress=not args.no_progress,
                        stop_after_step=args.stop_after_step)
        code = INTERRUPTED_EXIT if summary.stopped_by == "interrupted" else 0
        if jax.process_index() != 0:
            return code
        print(f"{summary.stopped_by}: step {summary.final_step} of {config.run.steps}, last loss {summary.last_loss}")
        if summary.eval_metrics:
            print("eval: " + ", ".join(f"{k}={v:.4f}" for k, v in summary.eval_metrics.items()))
        print(f"checkpoints: {summary.checkpoint_dir}")
        print(f"metrics:     {summary.metrics_file}")
        if code:
            print(f"interrupted at step {summary.final_step}: its checkpoint is in {summary.checkpoint_dir}; run the "
                  f"same command again to resume at step {summary.final_step + 1}", file=sys.stderr)
        return code

    return run


def _prepare(parser: argparse.ArgumentParser):
    """`prepare <domain> ...`: each domain that declares a prepare command, as a sub-command."""
    from triskele.train.domains import domains

    runners = {}
    choices = parser.add_subparsers(dest="domain", required=True, metavar="DOMAIN")
    for name, domain in domains().items():
        if domain.prepare is not None:
            summary = domain.prepare.summary
            sub = choices.add_parser(name, help=summary.splitlines()[0], description=summary,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
            runners[name] = domain.prepare.build(sub)
    return lambda args: runners[args.domain](args)


def _plan() -> Command:
    from triskele.train.tools.plan import PLAN

    return PLAN


PREPARE = Command("Turn a domain's raw data into the layout it trains on (e.g. face crops from videos).", _prepare)
def _pack() -> Command:
    from triskele.train.tools.pack import PACK

    return PACK


def _status() -> Command:
    from triskele.train.tools.status import STATUS

    return STATUS


COMMANDS = LazyCommands({"plan": _plan, "prepare": lambda: PREPARE, "pack": _pack, "status": _status})
SUMMARY = (f"Train a triskele preset. With no arguments: {DEFAULT_PRESET} on synthetic data, local devices. "
           "Commands: `plan` (the mesh planner), `prepare DOMAIN` (raw data into a domain's layout), `pack` (a "
           "tree into ArrayRecord shards of decoded records), `status` (whether a run has reached its last step); "
           "each with --help.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    train = Command(SUMMARY, functools.partial(_train, argv=argv))
    return run_command_line("python -m triskele.train", COMMANDS, train, argv, _errors)


def _errors() -> dict[type[BaseException], int]:
    from triskele.train.checkpoints.manager import CheckpointSaveError

    return {ConnectionError: 3, ValueError: 2, FloatingPointError: 1, CheckpointSaveError: 1}
