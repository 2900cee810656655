"""`python -m triskele.train plan`: the mesh planner for a preset or any transformer shape on N
GPUs, the cost of a run, and the inference roofline (predictions only). Argument parsing and
printing: the inputs and picks are `triskele.train.tools.plan_inputs`'s, the ranking the planner's.

    python -m triskele.train plan --preset mars-l16 --devices 64 --gpu h200 --global-batch 1024 \
        [--nodes 8] [--nvlink-domain 8] [--nvlink-gbps G] [--network-gbps G] [--set KEY=VALUE ...] \
        [--cost --train-images N | --epochs E --dataset-size N] [--top 10] [--output DIR]
    python -m triskele.train plan --shape width=4096,depth=36,heads=32,mlp=16384,tokens=2048 \
        --devices 128 --gpu a100 --global-batch 512 [--axes pipeline,data,tensor] [--schedule 1f1b]
    python -m triskele.train plan --preset mars-l16 --gpu h200 --global-batch 1024 --scaling [--cost ...]
    python -m triskele.train plan --preset mars-l16 --inference --batch 1 [--format fp8]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

# `--help` imports no JAX: the tables its flags name (GPUs, mesh axes, schedules, formats) are plain
# Python; what builds a model (triskele.train.tools.plan_inputs: JAX, Flax) loads once a plan runs.
from triskele.mesh.perf.explanation import explain
from triskele.mesh.perf.hardware import GPUS, Gpu, get_gpu
from triskele.mesh.perf.planner import (
    BEST_SCHEDULE,
    SCHEDULES,
    SIMPLICITY_MARGIN,
    PlanInputs,
    candidates,
    scaling,
)
from triskele.mesh.perf.roofline import FORMAT_BYTES, roofline
from triskele.mesh.perf.run_cost import ownership, run_cost
from triskele.mesh.perf.transformer_shape import parse_shape
from triskele.mesh.shape import ModelShape
from triskele.mesh.spec import MESH_AXES
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.bookkeeping.plots import save_figure
from triskele.train.commands import Command, bounded, folder, run_command_line
from triskele.train.config.overrides import make_config
from triskele.train.config.presets import PRESETS

if TYPE_CHECKING:
    from triskele.train.tools.plan_inputs import AbstractModel

SCALING_DEVICES = [8, 16, 32, 64, 128, 256, 512, 1024]
ATTENTION_NOTES = {
    "fused": "fused kernel (cuDNN): probabilities kept on chip, scores recomputed in the backward",
    "xla": "XLA's matmuls and softmax: the probabilities pass through HBM in float32",
}


def print_rows(rows: list[dict], columns: list[str]) -> None:
    def cell(value) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    widths = [max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(cell(row.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True)))


def per_second(rows: list[dict], key: str, shape: ModelShape, tokens: bool) -> str:
    """The column of the workload's throughput: `key` (images, or sequences, per second) as it is, or
    for a token shape (`--shape`) renamed to tokens and multiplied by the tokens per sequence."""
    if not tokens:
        return key
    name = key.replace("images", "tokens")
    for row in rows:
        row[name] = row.pop(key) * shape.tokens
    return name


def plot_scaling(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, choice in enumerate(dict.fromkeys(r["choice"] for r in rows)):
        points = [r for r in rows if r["choice"] == choice and "step_ms" in r]
        if not points:
            continue
        x = [r["devices"] for r in points]
        style = dict(marker="o", linestyle=("-", "--", "-.", ":")[i % 4], label=choice)
        line, = left.plot(x, [r["step_ms"] for r in points], **style)
        right.plot(x, [r["efficiency"] for r in points], color=line.get_color(), **style)
        bound = [r for r in points if r["comm_bound"]]
        left.scatter([r["devices"] for r in bound], [r["step_ms"] for r in bound], s=120, facecolors="none",
                     edgecolors="red", zorder=3)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    left.set_yscale("log")
    left.set_ylabel("predicted step time (ms)")
    left.set_title("step time (red circle: data/fsdp communication-bound)")
    right.set_ylabel("images/s per GPU / best at 8 GPUs")
    right.set_title("scaling efficiency")
    right.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    """The `plan` command's flags, added to `parser`."""
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--preset", choices=sorted(PRESETS), metavar="NAME", help="a preset's model")
    model.add_argument("--shape", metavar="SIZES",
                       help="any transformer: width=W,depth=L,heads=H,mlp=M,tokens=S[,vocab=V]")
    parser.add_argument("--devices", type=bounded(int, 1),
                        help="GPUs in the job (required unless --scaling or --inference)")
    parser.add_argument("--gpu", help=f"one of {', '.join(GPUS)} (--inference: default every one)")
    parser.add_argument("--global-batch", type=bounded(int, 1),
                        help="images (sequences) per step (default: the preset's)")
    parser.add_argument("--nodes", type=bounded(int, 1), help="hosts (default: devices / 8)")
    parser.add_argument("--nvlink-domain", type=bounded(int, 1), help="GPUs joined by NVLink (default: GPUs per node)")
    parser.add_argument("--nvlink-gbps", type=bounded(float, 0.001),
                        help="NVLink GB/s per GPU, one direction (default: the GPU's)")
    parser.add_argument("--network-gbps", type=bounded(float, 0.001),
                        help="network GB/s per GPU, one direction (default: the GPU's; e.g. 25 for 8 x HDR per node)")
    parser.add_argument("--efficiency", type=bounded(float, 0.001, 1),
                        help="share of peak the matmuls reach (default: the GPU's)")
    parser.add_argument("--gpu-memory-gb", type=bounded(float, 0.001), help="plan for this much memory per GPU")
    parser.add_argument("--axes", help=f"mesh axes the planner may use (default all: {','.join(MESH_AXES)})")
    parser.add_argument("--schedule", choices=(*SCHEDULES, BEST_SCHEDULE), default=BEST_SCHEDULE,
                        help="pipeline schedule: circular, 1f1b (interleaved for repeats > 1), or best (both "
                             "priced, each mesh's faster kept)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--top", type=bounded(int, 1), default=10, help="rows of the ranking to print")
    parser.add_argument("--scaling", action="store_true", help="predicted scaling from 8 to 1,024 GPUs")
    parser.add_argument("--output", type=folder, help="folder for plan.json / scaling.json and scaling.png (default .)")
    cost = parser.add_argument_group("cost of a run (--cost)")
    cost.add_argument("--cost", action="store_true", help="add wall time, GPU-hours and rented / owned cost")
    cost.add_argument("--train-images", type=bounded(float, 1),
                      help="images the run trains on (or --epochs with --dataset-size)")
    cost.add_argument("--epochs", type=bounded(float, 0.001))
    cost.add_argument("--dataset-size", type=bounded(float, 1))
    cost.add_argument("--price-per-gpu-hour", type=bounded(float, 0),
                      help="rental USD (default: the GPU's on-demand price)")
    cost.add_argument("--server-price", type=bounded(float, 0),
                      help="USD per owned 8-GPU server (default per GPU type)")
    cost.add_argument("--years", type=bounded(float, 0.001), default=5.0, help="depreciation years (5)")
    cost.add_argument("--pue", type=bounded(float, 1), default=1.56, help="power usage effectiveness (1.56)")
    cost.add_argument("--kwh-price", type=bounded(float, 0), default=0.08, help="USD per kWh (0.08)")
    cost.add_argument("--utilisation", type=bounded(float, 0.001, 1), default=1.0,
                      help="share of the year owned servers are busy (1.0): spreads their price")
    infer = parser.add_argument_group("inference roofline (--inference)")
    infer.add_argument("--inference", action="store_true", help="images/s per GPU: compute vs HBM bound")
    infer.add_argument("--batch", type=bounded(int, 1), default=1, help="images per forward (1)")
    infer.add_argument("--format", default="bfloat16", help=f"weights: {', '.join(FORMAT_BYTES)}")


def _train_images(args: argparse.Namespace) -> float:
    if args.train_images is not None:
        images = args.train_images
    elif args.epochs is not None and args.dataset_size is not None:
        images = args.epochs * args.dataset_size
    else:
        raise ValueError("--cost needs --train-images N, or --epochs E with --dataset-size N")
    if images <= 0:
        raise ValueError(f"--cost: the run must train on a positive number of images, got {images}")
    return images


def _with_cost(rows: list[dict], args: argparse.Namespace, gpu: Gpu, batch: int, devices_of) -> list[dict]:
    owning = ownership(gpu, args.price_per_gpu_hour, args.server_price, args.years, args.pue, args.kwh_price,
                       utilisation=args.utilisation)
    images = _train_images(args)
    for row in rows:
        if "step_ms" in row:
            row.update(run_cost(row["step_ms"] / 1e3, devices_of(row), batch, int(images), owning))
    return rows


def _inference(args: argparse.Namespace, model: AbstractModel | None, shape: ModelShape, attention: str) -> int:
    """The inference roofline; `attention`: `model.attention` as set (auto, xla, cudnn)."""
    from triskele.train.tools.plan_inputs import parameter_count, planned_attention

    gpus = [get_gpu(args.gpu)] if args.gpu else list(GPUS.values())
    weights = parameter_count(model, shape)
    planned = planned_attention(attention, "bfloat16")
    rows = [dataclasses.asdict(roofline(shape, weights, g.with_links(args.nvlink_gbps, args.network_gbps),
                                        args.format, args.batch, args.efficiency, planned)) for g in gpus]
    name = args.preset or args.shape
    print(f"{name}: inference roofline, {weights / 1e6:.1f}M weights in {args.format}, batch {args.batch}, "
          f"attention: {ATTENTION_NOTES[planned]}")
    for row in rows:
        row["compute_ms"], row["memory_ms"] = 1e3 * row.pop("compute_s"), 1e3 * row.pop("memory_s")
    throughput = per_second(rows, "images_per_sec", shape, tokens=model is None)
    print_rows(rows, ["gpu", "format", "batch", throughput, "bound", "compute_ms", "memory_ms", "compute_bound_from"])
    if args.output:
        write_atomically(Path(args.output) / "plan.json", (json.dumps(rows, indent=2, default=str) + "\n").encode())
    return 0


def run_plan(args: argparse.Namespace) -> int:
    """Runs a parsed `plan` command line: prints the ranking (or scaling, or roofline); a ValueError
    says what to change."""
    from triskele.train.tools.plan_inputs import abstract_model, plan_inputs, shape_inputs

    if args.efficiency is not None and not 0 < args.efficiency <= 1:
        raise ValueError(f"--efficiency must be in (0, 1], got {args.efficiency}")
    config = model = None
    shape_options: dict[str, str] = {}
    if args.preset:
        overrides = list(args.set) + ([f"data.global_batch={args.global_batch}"] if args.global_batch else [])
        config = make_config(args.preset, overrides)
        batch = config.data.global_batch
        model = abstract_model(config)  # once: every device count below plans the same model
        shape = model.shape
    else:
        shape = parse_shape(args.shape)
        batch = args.global_batch
        shape_options = _shape_settings(args.set)
    if args.inference:
        return _inference(args, model, shape, config.model.attention if config else
                          shape_options.get("attention", "auto"))
    if not args.gpu:
        raise ValueError(f"--gpu is required; one of {', '.join(GPUS)}")
    if config is None and not batch:
        raise ValueError("--shape needs --global-batch")
    axes = tuple(a.strip() for a in args.axes.split(",")) if args.axes else MESH_AXES
    unknown = [a for a in axes if a not in MESH_AXES]
    if unknown or not axes:
        raise ValueError(f"--axes {args.axes!r}: unknown {unknown}; axes are {', '.join(MESH_AXES)}")
    gpu = get_gpu(args.gpu).with_links(args.nvlink_gbps, args.network_gbps)
    options = {"axes": axes, "schedule": args.schedule}

    def make(devices: int, nodes: int | None) -> PlanInputs:
        if config is None:
            return shape_inputs(shape, batch, gpu, devices, nodes, args.nvlink_domain, args.efficiency,
                                args.gpu_memory_gb, **shape_options, **options)
        return plan_inputs(config, gpu, devices, nodes, args.nvlink_domain, args.efficiency, args.gpu_memory_gb,
                           model=model, **options)

    if args.scaling:
        return _print_scaling(args, make, gpu, batch)
    if not args.devices:
        raise ValueError("--devices is required (or ask for --scaling or --inference)")
    return _print_ranking(args, make(args.devices, args.nodes), batch, tokens=config is None)


def _shape_settings(settings: list[str]) -> dict[str, str]:
    """What `--set` may say with `--shape`: `model.attention` only (the rest configures a preset's run)."""
    options = {}
    for setting in settings:
        key, _, value = setting.partition("=")
        if key.strip() != "model.attention" or not value:
            raise ValueError(f"--set {setting!r}: with --shape, --set takes only model.attention=auto|xla|cudnn; "
                             "other keys configure a preset's run (use --preset)")
        options["attention"] = value.strip()
    return options


def _print_scaling(args: argparse.Namespace, make, gpu: Gpu, batch: int) -> int:
    """Predicted step time and scaling efficiency over SCALING_DEVICES, as a table, a plot and JSON."""
    output = Path(args.output or ".")
    gpus_per_node = args.devices // args.nodes if args.devices and args.nodes else gpu.gpus_per_node
    rows = scaling(lambda n: make(n, max(1, n // gpus_per_node)), SCALING_DEVICES)
    columns = ["devices", "choice", "mesh", "step_ms", "efficiency", "mfu", "fits", "comm_bound"]
    if args.cost:
        rows = _with_cost(rows, args, gpu, batch, lambda row: row["devices"])
        columns += ["hours", "gpu_hours", "cost_rent_usd", "cost_own_usd"]
    print(f"{args.preset or args.shape}, global batch {batch}, {gpu.name}, {gpus_per_node} GPUs per node: "
          "predicted step time and scaling efficiency")
    print_rows(rows, columns)
    plot_scaling(rows, output / "scaling.png")
    write_atomically(output / "scaling.json", (json.dumps(rows, indent=2) + "\n").encode())
    print(f"wrote {output / 'scaling.png'} and {output / 'scaling.json'}")
    return 0


def _print_ranking(args: argparse.Namespace, inputs: PlanInputs, batch: int, tokens: bool) -> int:
    """Every valid mesh of `--devices` in the planner's order, the pick and why, its cost with `--cost`;
    throughput in tokens for a token shape (`tokens`), else in images."""
    from triskele.train.tools.plan_inputs import pick_flags

    name = args.preset or args.shape
    ranked = candidates(inputs)
    if not ranked:
        raise ValueError(f"no mesh of {args.devices} devices passes validation for {name} at global batch "
                         f"{batch}; change --devices or --global-batch")
    print(f"{name} on {args.devices} x {inputs.gpu.name} ({inputs.nodes} node(s), NVLink domain "
          f"{inputs.nvlink_domain}), global batch {batch}, {inputs.compute}, efficiency {inputs.efficiency} "
          f"({inputs.gpu.efficiency_source}): {len(ranked)} valid meshes, {sum(c.fits for c in ranked)} fit")
    print(f"attention: {ATTENTION_NOTES[inputs.attention]} (--set model.attention=xla|cudnn|auto changes it)")
    rows = [c.row() for c in ranked]
    throughput = per_second(rows, "images_per_s", inputs.shape, tokens)
    columns = ["mesh", "schedule", "microbatches", "grad_accum", "remat", "memory_GB", "fits", "compute_ms", "comm_ms",
               "exposed_comm_ms", "bubble", "step_ms", "rank_ms", throughput, "mfu"]
    if args.cost:
        rows = _with_cost(rows, args, inputs.gpu, batch, lambda row: args.devices)
        columns += ["hours", "gpu_hours", "cost_rent_usd", "cost_own_usd"]
    print(f"in the planner's order: meshes that fit first, then by rank_ms, the predicted step_ms plus "
          f"{SIMPLICITY_MARGIN:.0%} per kind of parallelism (pipeline 2, tensor 1, fsdp 1, data 0.5)")
    print_rows(rows[: args.top], columns)
    best = ranked[0]
    if not best.fits:
        print(f"nothing fits in {inputs.gpu.name}'s memory: add devices or lower the batch")
    print(f"\npick: {pick_flags(best)}")
    for line in explain(best, inputs, ranked, "sequences" if tokens else "images"):
        print("  " + line)
    if args.cost:
        top = rows[0]
        print(f"  cost: {top['hours']:.1f} h on {args.devices} GPUs = {top['gpu_hours']:.0f} GPU-hours: rented "
              f"{top['cost_rent_usd']:,.0f} USD, owned {top['cost_own_usd']:,.0f} USD; owning is cheaper above "
              f"{top['break_even_hours_per_year']:,.0f} busy hours per year "
              f"({top['break_even_hours_per_year'] / 8766:.0%} utilisation)")
    if args.output:
        write_atomically(Path(args.output) / "plan.json", (json.dumps(rows, indent=2) + "\n").encode())
    return 0


def _plan(parser: argparse.ArgumentParser):
    add_plan_flags(parser)
    return run_plan


PLAN = Command(__doc__, _plan)


def main(argv: list[str]) -> int:
    """`python -m triskele.train plan ARGS`, as the training command line runs it."""
    return run_command_line("python -m triskele.train plan", {}, PLAN, argv, lambda: {ValueError: 2})
