"""Bytes each device sends per train step, by collective kind: XLA's compiled HLO beside the minimum.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/collectives.py \
        [--preset mars-l16] [--set KEY=VALUE ...] [--mesh SPEC ...] [--json FILE]

Measured: every all-reduce, all-gather, reduce-scatter, collective-permute and all-to-all of the
compiled (per-device) program, each counted as often as the loops around it run, at the bytes a
ring algorithm sends (all-reduce 2(N-1)/N x size, all-gather and reduce-scatter (N-1)/N x the
whole array, permute the whole operand). Analytic (`triskele.mesh.perf.formulas.step_collectives`): ring
all-reduce of the gradients over `data`; an fsdp all-gather of the weights and a reduce-scatter of
the gradients; Megatron's four activation all-reduces per block over `tensor`; the pipeline's
microbatch permutes and one broadcast of its outputs.
"""

from __future__ import annotations

import sys

from common import mesh_bench_main
from triskele.train.auto_mesh import resolve_auto_mesh
from triskele.train.config.overrides import make_config
from triskele.train.run import prepare
from triskele.train.tools.step_analysis import compile_train_step, measure, predict

NOTES = """\
Where the ratio is far from 1, what the HLO shows (XLA:CPU):
- fsdp: the gradients are summed with all-reduce (no reduce-scatter on CPU: twice the bytes of
  the minimum), and the weights are gathered again for the backward (and for a recomputed
  forward under remat) instead of being kept from the forward: ~2x the all-gather bytes.
- pipeline: the data-parallel gradient all-reduce of each stage's weights runs inside the
  schedule's loop, once per iteration and layer, instead of once after the loop (XLA:CPU does not
  move all-reduces out of while loops); the permutes match the minimum.
- data=2,fsdp=2,tensor=2: the fsdp effects above (gradient all-reduce instead of reduce-scatter,
  weights gathered twice) on the fsdp share; the tensor and data parts match their formulas.
- tensor: with `full` remat the recomputed forward repeats the attention output's all-reduce;
  the formula counts it (4 + 1 per block), so the ratio stays 1.
- optim.grad_accum=k: the data all-reduce runs once, after the microbatch loop (data=8, mars-tiny
  at 32 px, depth 2: 1.23 MB at k=1 and k=4); fsdp's gathers and gradient reductions run in the
  loop, k times (the planner counts them so; the analytic column here counts them once)."""
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def measure_mesh(preset: str, overrides: list[str], spec: str) -> list[dict]:
    parts = prepare(make_config(preset, [*overrides, f"mesh={spec}"]), choose_mesh=resolve_auto_mesh)
    compiled, _ = compile_train_step(parts)
    measured = measure(compiled, parts.mesh).program
    analytic = predict(parts).collectives
    rows = []
    for kind in KINDS:
        got, want = measured.collective_bytes.get(kind, 0.0), analytic.get(kind, 0.0)
        if got or want:
            rows.append({"mesh": spec, "kind": kind, "count": measured.collective_counts.get(kind, 0),
                         "measured_MB": got / 1e6, "analytic_MB": want / 1e6,
                         "ratio": got / want if want else None})
    total_got = sum(measured.collective_bytes.values())
    total_want = sum(analytic.values())
    rows.append({"mesh": spec, "kind": "total", "count": sum(measured.collective_counts.values()),
                 "measured_MB": total_got / 1e6, "analytic_MB": total_want / 1e6,
                 "ratio": total_got / total_want if total_want else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    columns = ["mesh", "kind", "count", "measured_MB", "analytic_MB", "ratio"]
    return mesh_bench_main(__doc__, argv, measure_mesh, columns, "bytes sent per device per train step", NOTES)


if __name__ == "__main__":
    sys.exit(main())
