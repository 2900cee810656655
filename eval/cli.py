"""`python -m triskele.eval` (evaluate a checkpoint) and its commands: predict, serve, quantize, export (a
jax.export serving artifact), export-weights (the backbone as timm safetensors), and each domain's
own (merch's gallery). Domains add their evaluate and predict flags from their specs."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from collections.abc import Callable

from triskele.eval.defaults import INFERENCE_BATCH_PER_DEVICE
from triskele.train.bookkeeping.stop import INTERRUPTED_EXIT
from triskele.train.commands import (
    Command,
    LazyCommands,
    Runner,
    add_coordinator_flags,
    add_dataclass_flags,
    add_domain_flags,
    bounded,
    file_in_folder,
    folder,
    run_command_line,
)
from triskele.train.config.limits import add_limits_flag, input_limits
from triskele.train.domains import Domain, domains


def _common(parser: argparse.ArgumentParser, workdir_required: bool = True) -> None:
    parser.add_argument("--workdir", required=workdir_required, type=folder,
                        help="the training run's folder (holds checkpoints/)")
    parser.add_argument("--mesh", help="mesh spec to run on, or auto (evaluation: the planner's pick); default: "
                        "all local devices on data")
    parser.add_argument("--step", type=bounded(int, 0), help="checkpoint step (default: the latest)")


def _evaluate(parser):
    parser.add_argument("--data", help="on-disk dataset (default: the run's own data)")
    parser.add_argument("--split", default="test",
                        help="split to evaluate: test (default; the report's), val (held out of the training "
                             "data: what training selected its best checkpoint on) or train")
    parser.add_argument("--output", metavar="DIR", type=folder, help="folder for the report and its pictures (default: "
                        "WORKDIR/eval/<step>; needed where the run's folder is read-only)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (evaluation draws none: accepted as train and predict accept it)")
    flags = {name: domain.evaluate_flags for name, domain in domains().items()}
    add_domain_flags(parser, flags)

    def run(a):
        from triskele.eval.report import evaluate_checkpoint

        options = {flag.dest: getattr(a, flag.dest) for domain_flags in flags.values() for flag in domain_flags}
        return evaluate_checkpoint(a.workdir, a.mesh, a.data, a.split, a.step, a.output, **options)

    return run


def _predict(parser):
    parser.add_argument("--input", required=True,
                        help="a folder (searched recursively), a glob in quotes, or a .txt file of paths")
    parser.add_argument("--output", required=True, type=folder, help="folder for the predictions")
    parser.add_argument("--exported", metavar="FILE", help="use this exported model instead of a checkpoint "
                                                           "(--workdir still finds what its run keeps beside the "
                                                           "model, e.g. a gallery index)")
    parser.add_argument("--batch", type=bounded(int, 1),
                        help=f"records per batch (default {INFERENCE_BATCH_PER_DEVICE} per "
                                                  "device on data x fsdp)")
    parser.add_argument("--workers", type=bounded(int, 0), default=0,
                        help="input worker processes (default 0: threads)")
    parser.add_argument("--threads", type=bounded(int, 1), default=4,
                        help="input threads when --workers is 0 (default 4)")
    parser.add_argument("--prefetch", type=bounded(int, 1), default=8,
                        help="inputs read ahead of the model (default 8)")
    parser.add_argument("--overwrite", action="store_true",
                        help="predict every input again, also with another model or options than OUT's manifest")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_limits_flag(parser)
    flags = {name: domain.predict_flags for name, domain in domains().items()}
    add_domain_flags(parser, flags)
    _distributed(parser)

    def run(a):
        from triskele.eval.prediction import predict

        _start_distributed(a)
        options = {flag.dest: getattr(a, flag.dest) for domain_flags in flags.values() for flag in domain_flags}
        summary = predict(a.workdir, a.input, a.output, a.mesh, a.step, a.exported, batch=a.batch,
                          overwrite=a.overwrite, workers=a.workers, threads=a.threads, prefetch=a.prefetch,
                          progress=not a.no_progress, limits=input_limits(a.set), **options)
        return summary, INTERRUPTED_EXIT if summary["interrupted"] else 1 if summary["unreadable"] else 0

    return run


def _serve(parser):
    from triskele.eval.defaults import SERVE_LIMITS, ServeOptions

    parser.add_argument("--exported", metavar="FILE", help="serve this exported model instead of a checkpoint")
    add_dataclass_flags(parser, ServeOptions)
    add_limits_flag(parser, defaults=SERVE_LIMITS)

    def run(a):
        from triskele.eval.serving.server import serve, serve_exit_code

        options = ServeOptions(**{field.name: getattr(a, field.name) for field in dataclasses.fields(ServeOptions)})
        summary = serve(a.workdir, a.exported, a.mesh, a.step, options, input_limits(a.set, SERVE_LIMITS))
        return summary, serve_exit_code(summary)

    return run


def _distributed(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("several processes (each predicts its share of the inputs)")
    add_coordinator_flags(group)


def _start_distributed(args) -> None:
    from triskele.mesh.distributed import DistributedOptions, initialize

    initialize(DistributedOptions(coordinator=args.coordinator, coordinator_bind=args.coordinator_bind,
                                  num_processes=args.num_processes, process_id=args.process_id))


def _quantize(parser):
    parser.add_argument("--format", required=True, help="int8, fp8 or fp4")
    parser.add_argument("--output", type=folder, help="folder for the copy (default: WORKDIR-FORMAT)")

    def run(a):
        from triskele.eval.quantize import quantize_checkpoint

        return quantize_checkpoint(a.workdir, a.format, a.step, a.output, a.mesh)

    return run


def _export(parser):
    parser.add_argument("--output", required=True, type=file_in_folder,
                        help="the file to write (FILE.json is written beside it)")
    parser.add_argument("--batch", default="dynamic", help="the batch size, or 'dynamic' (default)")
    parser.add_argument("--platforms", help="comma-separated, e.g. cpu,cuda (default: this machine's)")

    def run(a):
        from triskele.eval.export import export_model

        return export_model(a.workdir, a.output, a.batch, a.step, a.platforms)

    return run


def _export_weights(parser):
    parser.add_argument("--format", default="timm", help="timm (default)")
    parser.add_argument("--output", required=True, type=file_in_folder, help="the .safetensors file to write")

    def run(a):
        from triskele.eval.timm_weights import export_weights

        return export_weights(a.workdir, a.format, a.output, a.step, a.mesh)

    return run


SHARED = {
    "predict": Command("Predict every image of a folder with a checkpoint or an exported model.", _predict),
    "serve": Command("Serve a checkpoint or an exported model over HTTP (Open Inference Protocol v2).", _serve),
    "quantize": Command("Write a weight-quantized copy of a checkpoint for inference.", _quantize),
    "export": Command("Serialise the inference function with jax.export (weights included) for serving.", _export),
    "export-weights": Command("Write the trained backbone as a timm safetensors file.", _export_weights),
}


def _printing(command: Command, workdir_required: bool = True) -> Command:
    """The command with the common flags, its result printed as JSON by process 0."""

    def build(parser: argparse.ArgumentParser) -> Runner:
        _common(parser, workdir_required)
        run = command.build(parser)

        def printed(args: argparse.Namespace) -> int:
            result = run(args)
            result, code = result if isinstance(result, tuple) else (result, 0)
            import jax

            if jax.process_index() == 0:
                print(json.dumps(result, indent=2))
            return code

        return printed

    return Command(command.summary, build)


def _domain_command(domain: Domain, name: str) -> Command:
    """The domain's command `name`, from its inference module's COMMANDS (those its spec names)."""
    from triskele.eval.domains import inference_of

    table = inference_of(domain).COMMANDS
    if set(table) != set(domain.eval_commands):
        raise TypeError(f"domain {domain.name!r}: its inference module's COMMANDS are {', '.join(table) or 'none'}, "
                        f"its spec's eval_commands {', '.join(domain.eval_commands) or 'none'}")
    return table[name]


def _printing_loaded(load: Callable[[], Command], workdir_required: bool) -> Callable[[], Command]:
    return lambda: _printing(load(), workdir_required)


def commands() -> LazyCommands:
    """The shared commands and every domain's own; a domain's inference module loads only when one
    of its commands is chosen."""
    table: dict[str, Callable[[], Command]] = {name: functools.partial(SHARED.__getitem__, name) for name in SHARED}
    for domain in domains().values():
        for name in domain.eval_commands:
            if name in table:
                raise ValueError(f"domain {domain.name!r} declares eval command {name!r}, which exists already")
            table[name] = functools.partial(_domain_command, domain, name)
    return LazyCommands({name: _printing_loaded(load, workdir_required=name not in ("predict", "serve"))
                         for name, load in table.items()})


def main(argv: list[str] | None = None) -> int:
    table = commands()
    default = _printing(Command("Evaluate a checkpoint; writes WORKDIR/eval/<step>/. Commands: " + ", ".join(table),
                                _evaluate))
    return run_command_line("python -m triskele.eval", table, default, argv,
                            lambda: {ValueError: 2, ConnectionError: 3})
