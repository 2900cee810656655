"""The claims triskele was founded on, checked against the planner and the inference roofline
(predictions only: nothing here runs on a GPU).

    python -m triskele.train.tools.claims [--write-page [PAGE]]

One row per claim: the claim, the figure the performance model gives for each domain's ViT-L/16
preset (mars-l16, merch-l16, deepfake-l16) and for a ViT-L/16 ten times larger (width 3200, 32
heads, 24 blocks: 2.95B weights), whether it agrees (the rule is stated in the row) and the term
that decides it. `--write-page` replaces the table between the `<!-- claims: -->` markers of the
performance page (default docs/performance.md, from the checkout's root); tests/test_claims.py keeps
the two equal. B300 figures are the hardware table's (`triskele.mesh.perf.hardware`: NVIDIA's HGX
B300 platform page, as tabulated at glennklockwood.com/garden/processors/B300); no GPU has been
measured for these rows yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path

from triskele.mesh.perf.hardware import GPUS
from triskele.mesh.perf.planner import BEST_SCHEDULE, PlanInputs, best_for_mesh, candidates
from triskele.mesh.perf.roofline import roofline
from triskele.mesh.perf.transformer_shape import block_params
from triskele.mesh.shape import ModelShape
from triskele.mesh.spec import MeshSpec
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.config.overrides import make_config
from triskele.train.domains import domains as registered_domains
from triskele.train.tools.plan_inputs import abstract_model, plan_inputs, shape_inputs

PERFORMANCE = Path("docs/performance.md")
"""The performance page, from the checkout's root."""
TEN_X = "ViT-L/16 x10"
LARGE_BATCH = 256
NETWORKS_GBPS = (25, 50, 100)
DP_DEVICES = (8, 16, 32, 64, 128, 256, 512, 1024)
NVLINK_DOMAINS = (8, 72, 576)


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    shape: ModelShape
    weights: float
    global_batch: int
    plan: Callable[..., PlanInputs]
    """(gpu, devices, global batch, **options) -> the planner's inputs for this model."""


def domain_model(preset: str) -> Model:
    config = make_config(preset)
    model = abstract_model(config)

    def plan(gpu, devices: int, batch: int, **options) -> PlanInputs:
        batched = dataclasses.replace(config, data=dataclasses.replace(config.data, global_batch=batch))
        return plan_inputs(batched, gpu, devices, model=model, **options)

    return Model(preset, model.shape, model.parameter_count, config.data.global_batch, plan)


def ten_times_larger(base: ModelShape, global_batch: int) -> Model:
    shape = dataclasses.replace(base, width=3200, heads=32, mlp_dim=12800, head_flops=0.0, head_split_flops=0.0,
                                head_flops_without_input_grad=0.0, head_split_inputs=0, head_split_outputs=0)
    split, whole = block_params(shape)
    weights = shape.depth * (split + whole) + shape.tokens * shape.width
    return Model(TEN_X, shape, weights, global_batch,
                 lambda gpu, devices, batch, **options: shape_inputs(shape, batch, gpu, devices, **options))


def models() -> list[Model]:
    domains = [domain_model(f"{name}-l16") for name in registered_domains()]
    return [*domains, ten_times_larger(domains[0].shape, domains[0].global_batch)]


def images_per_s(model: Model, gpu: str, fmt: str, batch: int) -> float:
    return roofline(model.shape, model.weights, GPUS[gpu], fmt, batch).images_per_sec


def per_model(values: dict[str, float], unit: str = "x", digits: int = 2) -> str:
    """'a-b{unit} (ViT-L/16 presets), c{unit} (x10)' from {model name: value}."""
    domain = [v for name, v in values.items() if name != TEN_X]
    low, high = (f"{v:.{digits}f}" for v in (min(domain), max(domain)))
    spread = f"{low}{unit}" if low == high else f"{low}-{high}{unit}"
    return f"{spread} (ViT-L/16 presets), {values[TEN_X]:.{digits}f}{unit} (x10)"


def fp8_against_a100(ms: list[Model]) -> dict:
    ratio = {m.name: images_per_s(m, "h100", "fp8", LARGE_BATCH) / images_per_s(m, "a100", "bfloat16", LARGE_BATCH)
             for m in ms}
    peak = GPUS["h100"].peak_flops["fp8"] * GPUS["h100"].efficiency
    a100 = GPUS["a100"].peak_flops["bfloat16"] * GPUS["a100"].efficiency
    return {"claim": "H100 FP8 vs A100 BF16: up to 6x",
            "figure": f"{per_model(ratio)} images/s at batch {LARGE_BATCH} (inference roofline)",
            "agrees": "yes" if max(ratio.values()) >= 0.75 * 6 else "no",
            "rule": "the largest ratio reaches 75% of 6x",
            "term": f"compute: FP8 peak x efficiency {peak / 1e12:.0f} against A100 BF16's {a100 / 1e12:.0f} "
                    "TFLOP/s (datasheet peaks; efficiencies of the GPU table)"}


def fp4_against_fp8(ms: list[Model]) -> dict:
    parts, ratios = [], []
    for gpu in ("b200", "b300"):
        for batch in (1, LARGE_BATCH):
            ratio = {m.name: images_per_s(m, gpu, "fp4", batch) / images_per_s(m, gpu, "fp8", batch) for m in ms}
            ratios += list(ratio.values())
            parts.append(f"{gpu.upper()} batch {batch}: {per_model(ratio)}")
    return {"claim": "B200/B300 FP4 vs FP8 for inference: another 2-3x",
            "figure": "; ".join(parts),
            "agrees": "yes" if all(1.8 <= r <= 3.3 for r in ratios) else "partly",
            "rule": "every ratio within 2-3x, 10% margin",
            "term": "batch 1: weight bytes over HBM (FP4 0.53 byte a weight with its scales, FP8 1); large "
                    "batches: the FP4 peak (B200 9, B300 13.5 against 4.5 PFLOP/s FP8)"}


def h200_against_h100(ms: list[Model]) -> dict:
    parts, gains = [], []
    for fmt in ("bfloat16", "fp8"):
        for batch in (1, 16, LARGE_BATCH):
            gain = {m.name: images_per_s(m, "h200", fmt, batch) / images_per_s(m, "h100", fmt, batch) for m in ms}
            gains.append(max(gain.values()))
            parts.append(f"{fmt} batch {batch}: {per_model(gain)}")
    return {"claim": "H200 vs H100: 43% more bandwidth translates to throughput",
            "figure": "; ".join(parts),
            "agrees": "partly" if max(gains) > 1.3 and min(gains) < 1.1 else ("yes" if min(gains) > 1.3 else "no"),
            "rule": "yes: 1.3x or more at every batch and format; partly: only at some",
            "term": "memory-bound batches (weights read once a batch) gain 4.8 / 3.35 = 1.43x; compute-bound "
                    "ones none (the same GH100 tensor cores)"}


def tensor_in_nvlink_domains(ms: list[Model]) -> dict:
    devices, parts, tensors = 576, [], []
    big = ms[-1]
    for domain in NVLINK_DOMAINS:
        inputs = big.plan("b200", devices, 8 * devices, nvlink_domain=domain, nodes=devices // 8,
                          schedule=BEST_SCHEDULE)
        best = next(c for c in candidates(inputs) if c.fits)
        tensors.append(best.mesh.tensor)
        parts.append(f"domain {domain}: {best.mesh} ({1e3 * best.step_s:.0f} ms)")
    with_tensor = [str(d) for d, t in zip(NVLINK_DOMAINS, tensors, strict=True) if t > 1]
    return {"claim": "tensor parallelism inside NVLink domains of 8, 72 and 576 GPUs",
            "figure": f"{TEN_X} on 576 B200, batch {8 * devices}: " + "; ".join(parts),
            "agrees": "yes" if min(tensors) > 1 else ("partly" if max(tensors) > 1 else "no"),
            "rule": "yes: the pick uses tensor > 1 in every domain; partly: in some",
            "term": "tensor's per-block all-reduces sit on the critical path, fsdp's gathers hide under the "
                    "backward: " + (f"tensor > 1 only in the domains of {', '.join(with_tensor)} GPUs" if with_tensor
                                    else "tensor > 1 in no domain")}


def pipeline_bubble() -> dict:
    shape = dataclasses.replace(ModelShape(width=6144, depth=48, mlp_dim=24576, heads=48, patches=256,
                                           patch_dim=14 * 14 * 3))
    parts, bubbles = [], []
    for devices, batch in ((64, 256), (256, 1024)):
        inputs = shape_inputs(shape, batch, "h100", devices, schedule=BEST_SCHEDULE)
        best = next(c for c in candidates(inputs) if c.fits)
        bubbles.append(best.bubble)
        parts.append(f"{devices} H100, batch {batch}: {best.mesh} {best.schedule} M={best.microbatches} "
                     f"v={best.repeats}, bubble {best.bubble:.1%}")
    return {"claim": "the pipeline bubble at the pipeline sizes the planner picks: 15-30%",
            "figure": "ViT-22B: " + "; ".join(parts),
            "agrees": "yes" if all(0.15 <= b <= 0.30 for b in bubbles) else "no",
            "rule": "every picked pipeline's bubble within 15-30%",
            "term": "the planner raises microbatches and repeats until the bubble (P-1)/(vM+P-1) costs less "
                    "than what more of them cost"}


def data_parallel_turn(ms: list[Model]) -> dict:
    parts, turns = [], []
    for gbps in NETWORKS_GBPS:
        gpu = GPUS["h100"].with_links(network_gbps=gbps)
        turn = {}
        for m in ms:
            bound = [n for n in DP_DEVICES if _comm_bound(m.plan(gpu, n, m.global_batch), MeshSpec(data=n))]
            turn[m.name] = float(bound[0]) if bound else float("inf")
        turns += list(turn.values())
        parts.append(f"{gbps} GB/s: {per_model(turn, ' GPUs', 0)}")
    return {"claim": "data parallelism turns communication-bound beyond 64 GPUs",
            "figure": "H100, each model's global batch, pure data parallelism, first GPU count whose "
                      "all-reduce exceeds the last microbatch's backward: " + "; ".join(parts),
            "agrees": "yes" if all(t > 64 for t in turns) else ("partly" if any(t > 64 for t in turns) else "no"),
            "rule": "yes: beyond 64 for every model and network",
            "term": "the gradient all-reduce (2 x weights per GPU, fixed) over the network against the "
                    "per-GPU backward (shrinking as 1/GPUs at a fixed global batch)"}


def _comm_bound(inputs: PlanInputs, mesh: MeshSpec) -> bool:
    best = best_for_mesh(inputs, mesh, any_fit=True)
    return best is not None and best.comm_s["data"] > (2 / 3) * best.compute_s


def claims_rows() -> list[dict]:
    ms = models()
    return [fp8_against_a100(ms), fp4_against_fp8(ms), h200_against_h100(ms), tensor_in_nvlink_domains(ms),
            pipeline_bubble(), data_parallel_turn(ms)]


def claims_table(rows: list[dict] | None = None) -> str:
    """The performance page's claims table (markdown)."""
    rows = claims_rows() if rows is None else rows
    lines = ["| claim | figure | agrees | rule | deciding term |", "|---|---|---|---|---|"]
    lines += [f"| {r['claim']} | {r['figure']} | {r['agrees']} | {r['rule']} | {r['term']} |" for r in rows]
    return "\n".join(lines) + "\n"


MARKERS = re.compile(r"(<!-- claims:[^\n]*-->\n)(.*?)(<!-- /claims -->)", re.S)


def page_claims(text: str) -> str:
    found = MARKERS.search(text)
    if not found:
        raise ValueError("docs/performance.md has no claims table (<!-- claims: ... --> ... <!-- /claims -->)")
    return found.group(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-page", nargs="?", const=PERFORMANCE, type=Path, metavar="PAGE",
                        help=f"replace the claims table of PAGE (default {PERFORMANCE})")
    args = parser.parse_args(argv)
    table = claims_table()
    print(table, end="")
    if args.write_page:
        text = args.write_page.read_text()
        page_claims(text)
        write_atomically(args.write_page, MARKERS.sub(lambda m: m.group(1) + table + m.group(3), text).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
