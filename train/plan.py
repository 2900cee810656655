"""`python -m triskele.train plan`: the mesh planner for a preset on N GPUs (predictions only).

    python -m triskele.train plan --preset mars-l16 --devices 64 --gpu h200 --global-batch 1024 \
        [--nodes 8] [--nvlink-domain 8] [--set KEY=VALUE ...] [--top 10] [--output DIR]
    python -m triskele.train plan --preset mars-l16 --gpu h200 --global-batch 1024 --scaling [--output DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from flax import nnx
from jax.sharding import AbstractMesh
from triskele.mesh.hardware import GPUS, get_gpu
from triskele.mesh.logical import param_bytes
from triskele.mesh.planner import PlanInputs, candidates, explain, scaling
from triskele.mesh.spec import MESH_AXES, MeshSpec
from triskele.train.config import PRESETS, Config, make_config
from triskele.train.domains import get_domain
from triskele.train.validate import validate

SCALING_DEVICES = [8, 16, 32, 64, 128, 256, 512, 1024]


def abstract_mesh(mesh: MeshSpec) -> AbstractMesh:
    return AbstractMesh(tuple(getattr(mesh, a) for a in MESH_AXES), MESH_AXES)


def plan_inputs(config: Config, gpu_name: str, devices: int, nodes: int | None = None,
                nvlink_domain: int | None = None, efficiency: float = 0.5,
                memory_gb: float | None = None) -> PlanInputs:
    """The planner's inputs for a config: its model's sizes and parameter layout, its validation."""
    gpu = get_gpu(gpu_name)
    if devices < 1:
        raise ValueError(f"--devices must be at least 1, got {devices}")
    nodes = nodes or max(1, devices // 8)
    if devices % nodes:
        raise ValueError(f"--devices {devices} is not divisible by --nodes {nodes}; use a node count that divides it")
    domain = get_domain(config.domain)
    model = nnx.eval_shape(lambda: domain.build_model(config, nnx.Rngs(params=0), 1))
    params = nnx.state(model, nnx.Param)
    layouts: dict[MeshSpec, object] = {}

    def bytes_on(mesh: MeshSpec):
        if mesh not in layouts:
            layouts[mesh] = param_bytes(params, abstract_mesh(mesh))
        return layouts[mesh]

    def check(mesh: MeshSpec, microbatches: int, repeats: int) -> str | None:
        trial = dataclasses.replace(config, pipeline=dataclasses.replace(
            config.pipeline, microbatches=microbatches, repeats=repeats), mesh=str(mesh))
        try:
            validate(trial, abstract_mesh(mesh))
        except ValueError as err:
            return str(err)
        return None

    compute = {"float32": "float32", "fp8": "fp8"}.get(config.precision, "bfloat16")
    return PlanInputs(shape=model.cost_shape(), global_batch=config.data.global_batch, gpu=gpu, devices=devices,
                      nodes=nodes, nvlink_domain=nvlink_domain or devices // nodes, compute=compute,
                      efficiency=efficiency, param_bytes=bytes_on, validate=check,
                      memory_bytes=memory_gb * 1e9 if memory_gb else None)


def print_rows(rows: list[dict], columns: list[str]) -> None:
    def cell(value) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    widths = [max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(cell(row.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True)))


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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m triskele.train plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS), metavar="NAME")
    parser.add_argument("--devices", type=int, help="GPUs in the job (required unless --scaling)")
    parser.add_argument("--gpu", required=True, help=f"one of {', '.join(GPUS)}")
    parser.add_argument("--global-batch", type=int, help="images per step (default: the preset's)")
    parser.add_argument("--nodes", type=int, help="hosts (default: devices / 8)")
    parser.add_argument("--nvlink-domain", type=int, help="GPUs joined by NVLink (default: GPUs per node)")
    parser.add_argument("--efficiency", type=float, default=0.5, help="share of peak the matmuls reach (0.5)")
    parser.add_argument("--gpu-memory-gb", type=float, help="plan for this much memory per GPU")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--top", type=int, default=10, help="rows of the ranking to print")
    parser.add_argument("--scaling", action="store_true", help="predicted scaling from 8 to 1,024 GPUs")
    parser.add_argument("--output", help="folder for plan.json / scaling.json and scaling.png (default .)")
    return parser


def run(args: argparse.Namespace) -> int:
    overrides = list(args.set) + ([f"data.global_batch={args.global_batch}"] if args.global_batch else [])
    config = make_config(args.preset, overrides)
    if not 0 < args.efficiency <= 1:
        raise ValueError(f"--efficiency must be in (0, 1], got {args.efficiency}")
    output = Path(args.output or ".")
    gpus_per_node = args.devices // args.nodes if args.devices and args.nodes else 8
    if args.scaling:
        make = lambda n: plan_inputs(config, args.gpu, n, max(1, n // gpus_per_node), args.nvlink_domain,
                                     args.efficiency, args.gpu_memory_gb)
        rows = scaling(make, SCALING_DEVICES)
        print(f"{args.preset}, global batch {config.data.global_batch}, {get_gpu(args.gpu).name}, "
              f"{gpus_per_node} GPUs per node: predicted step time and scaling efficiency")
        print_rows(rows, ["devices", "choice", "mesh", "step_ms", "efficiency", "mfu", "fits", "comm_bound"])
        output.mkdir(parents=True, exist_ok=True)
        plot_scaling(rows, output / "scaling.png")
        (output / "scaling.json").write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {output / 'scaling.png'} and {output / 'scaling.json'}")
        return 0
    if not args.devices:
        raise ValueError("--devices is required (or ask for --scaling)")
    inputs = plan_inputs(config, args.gpu, args.devices, args.nodes, args.nvlink_domain, args.efficiency,
                         args.gpu_memory_gb)
    ranked = candidates(inputs)
    if not ranked:
        raise ValueError(f"no mesh of {args.devices} devices passes validation for {args.preset} at global batch "
                         f"{config.data.global_batch}; change --devices or --global-batch")
    print(f"{args.preset} on {args.devices} x {inputs.gpu.name} ({inputs.nodes} node(s), NVLink domain "
          f"{inputs.nvlink_domain}), global batch {config.data.global_batch}, {inputs.compute}, "
          f"efficiency {inputs.efficiency}: {len(ranked)} valid meshes, {sum(c.fits for c in ranked)} fit")
    print_rows([c.row() for c in ranked[: args.top]],
               ["mesh", "microbatches", "remat", "memory_GB", "fits", "compute_ms", "comm_ms", "exposed_comm_ms",
                "bubble", "step_ms", "images_per_s", "mfu"])
    best = ranked[0]
    if not best.fits:
        print(f"nothing fits in {inputs.gpu.name}'s memory: add devices or lower the batch")
    print(f"\npick: --mesh {best.mesh}" + (f" --set pipeline.microbatches={best.microbatches} "
                                           f"--set pipeline.repeats={best.repeats}" if best.mesh.pipeline > 1 else "")
          + f" --set model.remat={best.remat}")
    for line in explain(best, inputs):
        print("  " + line)
    if args.output:
        output.mkdir(parents=True, exist_ok=True)
        (output / "plan.json").write_text(json.dumps([c.row() for c in ranked], indent=2) + "\n")
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
