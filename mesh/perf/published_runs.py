"""Published training runs replayed through the planner: Megatron-LM's (read by bench/published.py
and the tests, never by a run).

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC21): GPT models on Selene (DGX A100 80 GB, 8 x 200 Gb/s HDR InfiniBand per node,
i.e. 25 GB/s per GPU), sequence 2048, MLP 4 x hidden, 51,200-token vocabulary, mixed precision
(16 bytes of state per parameter: fp16 weights and gradients, fp32 master weights and Adam
moments, updated in place: no weight-sized temporaries), the interleaved 1F1B pipeline schedule
and full activation recomputation; hand-fused elementwise kernels (one pass per op) and an fp16
softmax whose probabilities pass through HBM (no FlashAttention in 2021). Their FLOP count,
96 B s l h^2 (1 + s / 6h + V / 16 l h), is ours with full remat plus the vocabulary layer; that
layer is not part of a vision transformer, so its share is reported (`vocab_share`).

Table 1 (weak scaling, tensor + pipeline + data parallelism) and Table 2 (GPT-3 175B: the same
against ZeRO-3, data parallelism with every parameter, gradient and optimizer state sharded).
The paper's own search space has no fsdp: picks are made over pipeline, data and tensor, and the
planner's pick with fsdp allowed is reported beside.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from triskele.mesh.perf.formulas import train_flops
from triskele.mesh.perf.hardware import get_gpu
from triskele.mesh.perf.planner import Candidate, PlanInputs, best_for_mesh, candidates
from triskele.mesh.perf.transformer_shape import param_bytes, parse_shape, validator
from triskele.mesh.spec import MESH_AXES, MeshSpec

SEQUENCE, VOCAB = 2048, 51200
NETWORK_GBPS = 25.0
"""Selene: 8 x 200 Gb/s HDR InfiniBand per 8-GPU node."""


@dataclasses.dataclass(frozen=True)
class Row:
    params_b: float
    heads: int
    hidden: int
    layers: int
    tensor: int
    pipeline: int
    gpus: int
    batch: int
    tflops: float
    """Published teraFLOP/s per GPU."""

    @property
    def mesh(self) -> MeshSpec:
        return MeshSpec(pipeline=self.pipeline, data=self.gpus // (self.tensor * self.pipeline), tensor=self.tensor)


TABLE1 = (
    Row(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    Row(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    Row(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    Row(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    Row(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    Row(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    Row(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    Row(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    Row(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
)
GPT3_GPUS = (384, 768, 1536)
GPT3_PTDP = (153.0, 149.0, 141.0)
"""Table 2, tensor 8 x pipeline 12 x data: teraFLOP/s per GPU."""
GPT3_ZERO3 = (144.0, 88.0, 44.0)
GPT3 = Row(174.6, 96, 12288, 96, 8, 12, 384, 1536, 153)


def inputs_for(row: Row, gpus: int | None = None, efficiency: float | None = None,
               axes: tuple[str, ...] = ("pipeline", "data", "tensor")) -> PlanInputs:
    """The planner's inputs for a row as Megatron-LM ran it (A100 80 GB on Selene)."""
    gpus = gpus or row.gpus
    shape = parse_shape(f"width={row.hidden},depth={row.layers},heads={row.heads},mlp={4 * row.hidden},"
                        f"tokens={SEQUENCE},vocab={VOCAB}")
    gpu = get_gpu("a100").with_links(network_gbps=NETWORK_GBPS)
    return PlanInputs(shape=shape, global_batch=row.batch, gpu=gpu, devices=gpus, nodes=max(1, gpus // 8),
                      nvlink_domain=8, efficiency=gpu.efficiency if efficiency is None else efficiency,
                      param_bytes=param_bytes(shape, 2.0), validate=validator(shape, row.batch), axes=axes,
                      schedule="1f1b", megatron_1f1b=True, remat_options=("full",), optimizer_state=6.0,
                      probability_bytes=2, weight_temporaries=0.0, runtime="fused-kernels", attention="xla")


def achieved_tflops(candidate: Candidate, inputs: PlanInputs) -> float:
    """teraFLOP/s per GPU as the paper counts them (recomputation included, bubble excluded)."""
    flops = train_flops(inputs.shape, inputs.global_batch)
    counted = flops.blocks * 4 / 3 + flops.split + flops.replicated
    return counted / inputs.devices / candidate.step_s / 1e12


def vocab_share(row: Row) -> float:
    """Share of the paper's FLOPs in the vocabulary layer: (V / 16 l h) / (1 + s / 6h + V / 16 l h)."""
    vocab = VOCAB / (16 * row.layers * row.hidden)
    return vocab / (1 + SEQUENCE / (6 * row.hidden) + vocab)


def published_mesh_tflops(row: Row, efficiency: float | None = None) -> float:
    inputs = inputs_for(row, efficiency=efficiency)
    return achieved_tflops(best_for_mesh(inputs, row.mesh, any_fit=True), inputs)


def fit_efficiency(rows: tuple[Row, ...] = TABLE1, grid: np.ndarray | None = None) -> float:
    """The one efficiency that minimises the largest relative error over the rows' published meshes.
    Predicted TFLOP/s scale with it where compute dominates, so the grid is fine (0.005)."""
    grid = np.arange(0.30, 0.80, 0.005) if grid is None else grid

    def worst(eff: float) -> float:
        return max(abs(published_mesh_tflops(r, eff) / r.tflops - 1) for r in rows)

    return float(min(grid, key=worst).round(3))


def replay_row(row: Row, efficiency: float | None = None) -> dict:
    """The planner's pick for the row's GPUs and batch (Megatron's space and with fsdp) and the
    predicted teraFLOP/s per GPU of the published mesh and of the pick."""
    inputs = inputs_for(row, efficiency=efficiency)
    published = best_for_mesh(inputs, row.mesh, any_fit=True)
    pick = candidates(inputs)[0]
    with_fsdp = candidates(dataclasses.replace(inputs, axes=MESH_AXES))[0]
    predicted = achieved_tflops(published, inputs)
    return {"params_b": row.params_b, "gpus": row.gpus, "batch": row.batch,
            "published_mesh": str(row.mesh), "published_tflops": row.tflops,
            "predicted_tflops": predicted, "error": predicted / row.tflops - 1, "published_fits": published.fits,
            "published_memory_GB": published.memory.total / 1e9,
            "published_schedule": f"M={published.microbatches},v={published.repeats}" if row.pipeline > 1
            else f"accum={published.microbatches}",
            "pick": str(pick.mesh), "pick_tensor": pick.mesh.tensor, "pick_pipeline": pick.mesh.pipeline,
            "pick_tflops": achieved_tflops(pick, inputs), "pick_with_fsdp": str(with_fsdp.mesh),
            "fsdp_pick_tensor": with_fsdp.mesh.tensor, "fsdp_pick_pipeline": with_fsdp.mesh.pipeline,
            "fsdp_pick_tflops": achieved_tflops(with_fsdp, inputs), "vocab_share": vocab_share(row)}


def gpt3_row(gpus: int, efficiency: float | None = None, overlap: float | None = None) -> dict:
    """Table 2 at `gpus`: ZeRO-3 (fsdp over every GPU, weights gathered again for the backward)
    against tensor 8 x pipeline 12 x data; `overlap`: the planner's overlap efficiency (default its own)."""
    options = {} if overlap is None else {"overlap_efficiency": overlap}
    model_parallel = dataclasses.replace(inputs_for(GPT3, gpus, efficiency), **options)
    mesh = MeshSpec(pipeline=12, data=gpus // 96, tensor=8)
    ptdp_tflops = achieved_tflops(best_for_mesh(model_parallel, mesh, any_fit=True), model_parallel)
    sharded = dataclasses.replace(inputs_for(GPT3, gpus, efficiency, axes=("fsdp",)), fsdp_gathers=2,
                                  fsdp_collectives_per_layer=6, accumulation=False, **options)
    zero3_tflops = achieved_tflops(best_for_mesh(sharded, MeshSpec(fsdp=gpus), any_fit=True), sharded)
    ptdp, zero3 = (dict(zip(GPT3_GPUS, published, strict=True))[gpus] for published in (GPT3_PTDP, GPT3_ZERO3))
    return {"gpus": gpus, "ptdp_tflops": ptdp_tflops, "zero3_tflops": zero3_tflops,
            "ratio": zero3_tflops / ptdp_tflops, "published_ptdp": ptdp, "published_zero3": zero3,
            "published_ratio": zero3 / ptdp}


def replay_gpt3(efficiency: float | None = None) -> list[dict]:
    """Table 2 at 384, 768 and 1536 GPUs (`gpt3_row`)."""
    return [gpt3_row(gpus, efficiency) for gpus in GPT3_GPUS]


OVERLAP_CALIBRATION_GPUS = 384
"""The one Table 2 row the overlap efficiency is fitted on; the planner is judged on the others."""


def fit_overlap_efficiency(grid: np.ndarray | None = None) -> float:
    """The overlap efficiency (`planner.OVERLAP_EFFICIENCY`) whose ZeRO-3 / PTD-P ratio at
    OVERLAP_CALIBRATION_GPUS is nearest the published one (0.94), on a grid of 0.05."""
    grid = np.arange(0.0, 1.0001, 0.05) if grid is None else grid

    def miss(overlap: float) -> float:
        row = gpt3_row(OVERLAP_CALIBRATION_GPUS, overlap=overlap)
        return abs(row["ratio"] - row["published_ratio"])

    return float(min(grid, key=miss).round(3))
