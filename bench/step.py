"""Step time of the engine's train step, and of the same ViT hand-written in Flax NNX and in PyTorch.

    python bench/step.py --preset mars-b16 [--mesh SPEC] [--set KEY=VALUE ...] [--json FILE]
    python bench/step.py --compare tiny|vit-ti [--precision float32[,bfloat16,fp8]] [--json FILE]

`--preset`: compile time, median step time over repeats after warm-up (block_until_ready),
images/s, model FLOPs per device, achieved FLOP/s and MFU where the device's peak is known; and,
interleaved in the same process, the engine's loop fetching its metrics every step (a host sync
per step, as before) against fetching them every `run.log_every` steps.
`--compare`: the engine's step (ViTClassifier, the engine's optimizer and `make_train_step` on a
one-device mesh) beside a minimal hand-written Flax NNX step of the same shape (the floor for
framework overhead) and, where torch is installed, PyTorch eager, interleaved; ratios printed.
With several precisions (comma-separated), the engine's step in each, interleaved, without the
baselines (they are float32).
"""

from __future__ import annotations

import argparse
import sys

import jax
import numpy as np
from common import block, interleaved_seconds, machine, median, print_table, random_images, write_json
from flax import nnx
from triskele.mesh import host_to_global, make_mesh, process_rows
from triskele.mesh.perf.formulas import train_flops
from triskele.mesh.perf.hardware import peak_flops
from triskele.mesh.spec import MeshSpec
from triskele.models.vit import ViTClassifier, ViTConfig
from triskele.train.auto_mesh import resolve_auto_mesh
from triskele.train.config.overrides import make_config
from triskele.train.config.schema import OptimConfig
from triskele.train.data.pipeline import TrainStepLoader
from triskele.train.optim import make_optimizer
from triskele.train.precision import compute_dtype, matmul_dtype
from triskele.train.run import prepare
from triskele.train.state import init_state, state_shardings
from triskele.train.step import batch_shardings_of, make_train_step
from triskele.train.tools.step_analysis import compile_train_step, measure, model_shape

SHAPES = {
    "tiny": ({"width": 192, "depth": 6, "mlp_dim": 768, "heads": 3, "patch": 8, "image_size": 64, "channels": 3}, 32),
    "vit-ti": ({"width": 192, "depth": 12, "mlp_dim": 768, "heads": 3, "patch": 16, "image_size": 224,
                "channels": 3}, 16),
}
CLASSES = 10


def preset_bench(args) -> dict:
    overrides = list(args.set) + ([f"mesh={args.mesh}"] if args.mesh else [])
    config = make_config(args.preset, overrides)
    parts = prepare(config, choose_mesh=resolve_auto_mesh)
    mesh, batch_size = parts.mesh, config.data.global_batch
    source = parts.domain.open_split(config, "train")
    batch = host_to_global(TrainStepLoader(source, batch_size, 0, process_rows(mesh, batch_size))(0), mesh, batch_size)
    compiled, compile_s = compile_train_step(parts, batch)
    state = parts.init_state()
    measured = measure(compiled, mesh)
    shape = model_shape(parts)
    model_flops = train_flops(shape, batch_size).per_device(MeshSpec.parse(dict(mesh.shape)))
    holder = {"state": state}
    log_every = config.run.log_every

    def run(steps: int, fetch_every: int) -> None:
        kept = []
        with jax.set_mesh(mesh):
            for i in range(steps):
                holder["state"], metrics = compiled(holder["state"], batch)
                kept.append(metrics)
                if (i + 1) % fetch_every == 0:
                    jax.device_get(kept)
                    kept.clear()
            block(holder["state"])
            jax.device_get(kept)

    runners = {"metrics fetched every step": lambda k: run(k, 1),
               f"metrics fetched every {log_every} steps": lambda k: run(k, log_every)}
    times = interleaved_seconds(runners, args.steps, args.repeats)
    step_s = median(times[f"metrics fetched every {log_every} steps"])
    peak = peak_flops(jax.devices()[0], matmul_dtype(config.precision))
    achieved = model_flops / step_s
    rows = [{"run": name, "step_ms": 1e3 * median(t), "steps_per_s": 1 / median(t),
             "images_per_s": batch_size / median(t)} for name, t in times.items()]
    print(f"{args.preset} on mesh {dict(mesh.shape)}, {batch_size} images per step, {machine()['device_kind']}")
    print(f"compile {compile_s:.1f} s; model FLOPs per device per step {model_flops:.4g} "
          f"(HLO executed {measured.program.flops:.4g}); achieved {achieved / 1e12:.4g} TFLOP/s per device"
          + (f"; MFU {achieved / peak:.3f} of {peak / 1e12:.0f} TFLOP/s" if peak else "; MFU: peak unknown"))
    print_table(rows, ["run", "step_ms", "steps_per_s", "images_per_s"])
    return {"mode": "preset", "preset": args.preset, "mesh": dict(mesh.shape), "overrides": overrides,
            "machine": machine(), "compile_s": compile_s, "global_batch": batch_size,
            "model_flops_per_device": model_flops, "hlo_flops_per_device": measured.program.flops,
            "step_s": step_s, "images_per_s": batch_size / step_s, "achieved_flops_per_device": achieved,
            "peak_flops": peak, "mfu": achieved / peak if peak else None,
            "loop": {name: {"step_s": median(t), "samples": t} for name, t in times.items()}}


def triskele_runner(shape: dict, batch: int, precision: str):
    cfg = ViTConfig(**shape, dtype=compute_dtype(precision), fp8=precision == "fp8")
    build = lambda: ViTClassifier(cfg, CLASSES, rngs=nnx.Rngs(params=0))
    mesh = make_mesh("data=1", devices=jax.devices()[:1])
    optim = OptimConfig(warmup_steps=0)
    tx, schedule = make_optimizer(optim, 1000)
    graphdef, params = nnx.split(nnx.eval_shape(build), nnx.Param, ...)[:2]
    shardings = state_shardings(params, tx, mesh)
    local = {"image": random_images(batch, shape["image_size"], shape["channels"]),
             "label": np.arange(batch, dtype=np.int32) % CLASSES, "valid": np.ones(batch, np.float32)}
    data = host_to_global(local, mesh, batch)
    step = make_train_step(graphdef, tx, schedule, 1, shardings, batch_shardings_of(data, mesh, batch), mesh)
    holder = {"state": init_state(build, tx, shardings)}

    def run(steps: int) -> None:
        with jax.set_mesh(mesh):
            for _ in range(steps):
                holder["state"], metrics = step(holder["state"], data)
        block(holder["state"])

    return run


def handwritten_runner(shape: dict, batch: int, precision: str):
    from handwritten import make_step

    if precision != "float32":
        raise SystemExit("the hand-written step is float32 only")
    params, opt_state, step = make_step(shape, CLASSES)
    images = jax.numpy.asarray(random_images(batch, shape["image_size"], shape["channels"]))
    labels = jax.numpy.asarray(np.arange(batch, dtype=np.int32) % CLASSES)
    holder = {"params": params, "opt": opt_state}

    def run(steps: int) -> None:
        for _ in range(steps):
            holder["params"], holder["opt"], loss = step(holder["params"], holder["opt"], images, labels)
        block(holder["params"])

    return run


def torch_runner(shape: dict, batch: int):
    import torch
    from torch_vit import make_step

    torch.set_num_threads(max(1, len(__import__("os").sched_getaffinity(0))))
    step = make_step(shape, CLASSES)
    images = torch.from_numpy(random_images(batch, shape["image_size"], shape["channels"])).permute(0, 3, 1, 2)
    images = images.contiguous()
    labels = torch.from_numpy(np.arange(batch) % CLASSES)

    def run(steps: int) -> None:
        for _ in range(steps):
            step(images, labels)

    return run


def compare_bench(args) -> dict:
    shape, batch = SHAPES[args.compare]
    precisions = args.precision.split(",")
    runners = {f"triskele {p}" if len(precisions) > 1 else "triskele": triskele_runner(shape, batch, p)
               for p in precisions}
    if len(precisions) == 1:
        runners["flax_nnx_handwritten"] = handwritten_runner(shape, batch, "float32")
        try:
            runners["pytorch_eager"] = torch_runner(shape, batch)
        except ImportError:
            print("torch is not installed: PyTorch column skipped (pip install torch==2.13.0)", file=sys.stderr)
    times = interleaved_seconds(runners, args.steps, args.repeats)
    base, best = median(next(iter(times.values()))), min(next(iter(times.values())))
    rows = [{"implementation": name, "step_ms": 1e3 * median(t), "images_per_s": batch / median(t),
             "triskele_throughput_ratio": median(t) / base, "best_step_ms": 1e3 * min(t),
             "best_ratio": min(t) / best} for name, t in times.items()]
    print(f"shape {args.compare}: {shape}, batch {batch}, triskele in {args.precision}, {machine()['device_kind']}")
    print(f"triskele_throughput_ratio = other's median step time / {next(iter(times))}'s (>= 1: at least as "
          "fast); best_ratio: the same with each one's fastest round")
    print_table(rows, ["implementation", "step_ms", "images_per_s", "triskele_throughput_ratio", "best_step_ms",
                       "best_ratio"])
    return {"mode": "compare", "shape": args.compare, "dims": shape, "batch": batch, "precision": args.precision,
            "machine": machine(), "rows": rows, "samples": times}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--preset", help="an engine preset, e.g. mars-b16")
    what.add_argument("--compare", choices=sorted(SHAPES), help="side by side with hand-written Flax and PyTorch")
    parser.add_argument("--mesh", help="mesh spec (default: every device on data)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--precision", default="float32",
                        help="triskele's precision in --compare: float32, bfloat16, fp8, or several comma-separated")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed round")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (the median is reported)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    result = preset_bench(args) if args.preset else compare_bench(args)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
