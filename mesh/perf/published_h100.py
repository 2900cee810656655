"""NeMo's published H100 pre-training table replayed through the planner (read by bench/published.py
and the tests, never by a run; the planner is fitted on none of it).

NVIDIA NeMo, "Performance Benchmarks", Large Language Models, Pretraining (container NeMo 24.07,
DGX-H100, FP8): github.com/NVIDIA/NeMo, docs/source/performance/performance_summary.md. Each row
gives the GPUs, global and micro batch, sequence length, tensor (TP), pipeline (PP) and virtual
pipeline (VP) sizes, and the model TFLOP/s per GPU; data parallelism is the rest of the GPUs.
Megatron-core runs them: Transformer Engine's FP8 matmuls (attention in bfloat16, a fused kernel),
hand-fused elementwise kernels, the interleaved 1F1B schedule, and, as NeMo-Framework-Launcher's
`gpt3/*_fp8_performance.yaml` recipes set it, no recomputation (`selective` granularity over 0
layers) and `distributed_fused_adam` (fp32 master weights and moments sharded over data
parallelism). DGX-H100: 8 GPUs on NVLink, one 400 Gb/s NIC per GPU (the planner's H100 entry as
it stands).

The rows the planner's shape language holds: GPT-3 (multi-head attention, GELU MLP of 4 x width,
a 51,200-token vocabulary: the sizes of Megatron-LM's GPT-3 configurations) and Llama 2 7B and
13B (multi-head attention; their SwiGLU MLP of three width x 11,008 (13,824) matrices priced as a
GELU MLP of the same FLOPs and weights, 1.5 x 11,008 wide; 32,000 tokens). Left out: Llama 2 70B,
Nemotron and Llama 3 (grouped-query attention, which the shape language has no term for; Llama 3
also context parallelism, which the planner does not model).
"""

from __future__ import annotations

import dataclasses

from triskele.mesh.perf.hardware import get_gpu
from triskele.mesh.perf.planner import Candidate, PlanInputs, evaluate
from triskele.mesh.perf.transformer_shape import param_bytes, parse_shape, validator
from triskele.mesh.spec import MeshSpec

SOURCE = "NVIDIA NeMo 24.07 performance summary, DGX-H100, FP8 (github.com/NVIDIA/NeMo, docs/source/performance)"


@dataclasses.dataclass(frozen=True)
class NemoRow:
    model: str
    gpus: int
    batch: int
    micro_batch: int
    sequence: int
    tensor: int
    pipeline: int
    virtual: int
    tflops: float
    """Published model TFLOP/s per GPU."""
    width: int
    depth: int
    heads: int
    mlp: int
    vocab: int

    @property
    def mesh(self) -> MeshSpec:
        return MeshSpec(pipeline=self.pipeline, data=self.gpus // (self.tensor * self.pipeline), tensor=self.tensor)

    @property
    def microbatches(self) -> int:
        """Pipeline microbatches, or without a pipeline gradient accumulation steps, per data replica."""
        return self.batch // self.mesh.batch_shards // self.micro_batch


GPT3 = {"5B": (4096, 24, 32), "20B": (6144, 44, 48), "175B": (12288, 96, 96)}
NEMO_H100 = (
    *(NemoRow(f"GPT3-{size}", gpus, batch, micro, 2048, tp, pp, vp, tflops, *GPT3[size], 4 * GPT3[size][0], 51200)
      for size, gpus, batch, micro, tp, pp, vp, tflops in (
          ("5B", 64, 2048, 4, 1, 1, 1, 736), ("20B", 64, 256, 2, 2, 1, 1, 750), ("175B", 128, 256, 1, 4, 8, 6, 782),
          ("175B", 512, 2048, 2, 4, 8, 6, 842))),
    NemoRow("LLAMA2-7B", 8, 128, 1, 4096, 1, 1, 1, 776, 4096, 32, 32, 3 * 11008 // 2, 32000),
    NemoRow("LLAMA2-13B", 16, 128, 1, 4096, 1, 4, 10, 754, 5120, 40, 40, 3 * 13824 // 2, 32000),
)
TOLERANCE = 0.25
"""Largest relative miss of the predicted MFU on the published mesh (tests/test_published.py)."""


def inputs_for(row: NemoRow) -> PlanInputs:
    """The planner's inputs for a row as NeMo ran it."""
    shape = parse_shape(f"width={row.width},depth={row.depth},heads={row.heads},mlp={row.mlp},tokens={row.sequence},"
                        f"vocab={row.vocab}")
    gpu = get_gpu("h100")
    return PlanInputs(shape=shape, global_batch=row.batch, gpu=gpu, devices=row.gpus, nodes=max(1, row.gpus // 8),
                      nvlink_domain=8, compute="fp8", efficiency=gpu.efficiency, param_bytes=param_bytes(shape, 2.0),
                      validate=validator(shape, row.batch), schedule="1f1b", megatron_1f1b=True,
                      optimizer_state=6.0 / row.mesh.data, weight_temporaries=0.0, remat_options=("none",),
                      runtime="fused-kernels", attention="fused")


def published_candidate(row: NemoRow, inputs: PlanInputs | None = None) -> Candidate:
    """The row's published mesh and schedule priced as it ran (no recomputation)."""
    inputs = inputs_for(row) if inputs is None else inputs
    return evaluate(inputs, row.mesh, row.microbatches, row.virtual, inputs.remat_options[0])


def replay(row: NemoRow, inputs: PlanInputs | None = None) -> dict:
    """Predicted against published MFU (model FLOP/s over the FP8 peak) on the published mesh."""
    inputs = inputs_for(row) if inputs is None else inputs
    candidate = published_candidate(row, inputs)
    published = row.tflops * 1e12 / inputs.gpu.peak_flops["fp8"]
    return {"model": row.model, "gpus": row.gpus, "batch": row.batch, "tokens": row.sequence,
            "published_mesh": str(row.mesh), "schedule": f"M={row.microbatches},v={row.virtual}"
            if row.pipeline > 1 else f"accum={row.microbatches}", "fits": candidate.fits,
            "published_tflops": row.tflops, "published_mfu": published, "predicted_mfu": candidate.mfu,
            "error": candidate.mfu / published - 1}
