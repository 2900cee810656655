"""Inference roofline: images/s per GPU as the slower of compute and HBM traffic.

time(batch) = max(FLOPs / (the format's peak x efficiency), bytes / HBM bandwidth), with
bytes = weights in the format (read once per batch) + activations (written and read by every
layer, per image: `triskele.mesh.perf.formulas.activation_traffic_bytes`; the attention
probabilities only where attention runs outside a fused kernel). Small batches are bound by
reading the weights, so bandwidth (H200's 4.8 TB/s against H100's 3.35) buys throughput there and
with quantized weights; large batches are bound by compute, which the two share.
"""

from __future__ import annotations

import dataclasses
import math

from triskele.mesh.perf.formulas import activation_traffic_bytes, forward_flops
from triskele.mesh.perf.hardware import Gpu
from triskele.mesh.shape import ModelShape

FORMAT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5 + 1 / 32}
"""Bytes per weight; fp4 carries one 8-bit scale per 32 weights (as NVFP4/MXFP4 blocks do)."""


def compute_peak(gpu: Gpu, fmt: str) -> float:
    """The format's tensor-core rate, or BF16's where the GPU has none for it (weights dequantized)."""
    return gpu.peak_flops.get(fmt, gpu.peak_flops["bfloat16"])


@dataclasses.dataclass(frozen=True)
class Roofline:
    gpu: str
    format: str
    batch: int
    images_per_sec: float
    bound: str
    """`memory` or `compute`: which side sets the time."""
    compute_s: float
    memory_s: float
    compute_bound_from: float
    """The smallest batch at which compute sets the time (inf: never)."""


def roofline(shape: ModelShape, weights: float, gpu: Gpu, fmt: str, batch: int,
             efficiency: float | None = None, attention: str = "fused") -> Roofline:
    """`weights`: the model's parameter count. `efficiency`: share of peak (default the GPU's).
    `attention`: `fused` (cuDNN's kernel, what a GPU compiles in 16-bit: no probabilities in HBM) or
    `xla` (float32 probabilities through HBM)."""
    if fmt not in FORMAT_BYTES:
        raise ValueError(f"--format {fmt!r} is not one of {', '.join(FORMAT_BYTES)}")
    if batch < 1:
        raise ValueError(f"--batch must be at least 1, got {batch}")
    rate = compute_peak(gpu, fmt) * (gpu.efficiency if efficiency is None else efficiency)
    flops = forward_flops(shape, 1).total
    weight_bytes = weights * FORMAT_BYTES[fmt]
    per_image = activation_traffic_bytes(shape, shape.images_per_record,
                                         probability_bytes=4 if attention == "xla" else 0)
    compute = batch * flops / rate
    memory = (weight_bytes + batch * per_image) / gpu.memory_bandwidth
    slope = flops / rate - per_image / gpu.memory_bandwidth  # compute minus memory time per extra image
    turn = math.ceil(weight_bytes / gpu.memory_bandwidth / slope) if slope > 0 else math.inf
    turn = max(turn, 1) if slope > 0 else turn
    return Roofline(gpu.name, fmt, batch, batch / max(compute, memory), "compute" if compute >= memory else "memory",
                    compute, memory, turn)
