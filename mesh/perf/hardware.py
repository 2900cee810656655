"""The hardware table: peak dense matmul rates, memory bandwidth, interconnects, power and rental
prices of the GPUs the planner knows, and the entry of a JAX device.

Dense (no 2:4 sparsity) tensor-core figures per GPU, SXM parts:
- A100 SXM 80 GB: NVIDIA A100 Tensor Core GPU datasheet (BF16 312, TF32 156, INT8 624 TFLOPS
  dense; no FP8; HBM2e 2,039 GB/s; NVLink 600 GB/s; 400 W).
- H100 SXM: NVIDIA H100 Tensor Core GPU datasheet (BF16 1,979 TFLOPS and FP8/INT8 3,958 "with
  sparsity", i.e. 989.4 and 1,978.9 dense; TF32 494.7 dense; HBM3 3.35 TB/s; NVLink 900 GB/s; 700 W).
- H200 SXM: NVIDIA H200 Tensor Core GPU datasheet (the same GH100 tensor cores as H100 SXM: BF16
  989 / FP8 1,979 dense; HBM3e 4.8 TB/s, 141 GB; NVLink 900 GB/s; 700 W).
- B200: NVIDIA HGX B200 / DGX B200 datasheets (per 8 GPUs, sparse: FP4 144 PF, FP8 72 PF, BF16
  36 PF, TF32 18 PF -> per GPU dense: FP4 9, FP8 4.5, BF16 2.25, TF32 1.1 PFLOPS; HBM3e 8 TB/s,
  180 GB; NVLink 5 1.8 TB/s; 1,000 W).
- B300: NVIDIA HGX B300 platform page (per 8 GPUs: FP4 108 PF dense, FP8 72 PF and BF16 36 PF
  sparse -> per GPU dense: FP4 13.5, FP8 4.5, BF16 2.25 PFLOPS; HBM3e 8 TB/s, 288 GB; NVLink 5
  1.8 TB/s; 1,100 W), as tabulated at glennklockwood.com/garden/processors/B300. No INT8 figure is
  stated: int8 weights are planned at the BF16 rate there.
NVLink figures are both directions together; one direction is half. The network figure is one
400 Gb/s (B300: 800 Gb/s, ConnectX-8) NIC per GPU, as in the DGX/HGX reference designs; A100:
Selene's 8 x 200 Gb/s HDR InfiniBand per 8-GPU node (25 GB/s per GPU), where Megatron-LM ran.

`efficiency` is the share of peak a training step's matmuls reach: for A100 fitted once over
Megatron-LM's Table 1 (`bench/published.py`, which prints the fit). H100 and H200 (the same GH100
tensor cores): 0.55, Megatron-LM's README figure for its H100 runs ("up to 47% Model FLOP
Utilization (MFU) on H100 clusters", github.com/NVIDIA/Megatron-LM) times the ratio of A100's fitted
efficiency to Megatron-LM's best A100 MFU in Table 1 (0.615 / (163 / 312) = 1.18): the share of
a step's time outside the matmuls taken to be A100's. B200 and B300: no published run replayed,
the planner's assumption of 0.5. The matmul efficiency is one figure per GPU: the time outside the
matmuls (LayerNorm, softmax, GELU) is priced apart from HBM traffic, not measured on a GPU yet.

Rental prices (on-demand, USD per GPU-hour, the 8-GPU instance's price / 8): CoreWeave's list
prices as quoted on kaelresearch.com/blog/gpu-economics-real-inference-costs (February 2026):
HGX H100 49.24, HGX H200 50.44, B200 68.80, A100 80 GB 21.60 per 8 GPUs. B300: no public
on-demand price found; pass `--price-per-gpu-hour`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the table is plain data: reading it (`--help`, the planner) does not start JAX
    import jax


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: dict[str, float]
    """Dense tensor-core FLOP/s by compute dtype (`float32` means TF32 tensor cores; `int8` OP/s)."""
    memory_bandwidth: float
    """HBM bytes/s."""
    memory_bytes: float
    nvlink_bandwidth: float
    """Bytes/s per GPU, one direction."""
    network_bandwidth: float
    """Bytes/s per GPU across nodes, one direction."""
    board_power_w: float
    price_per_gpu_hour: float | None
    """On-demand rental, USD (None: no public price known)."""
    efficiency: float = 0.5
    """Share of peak a training step's matmuls reach (see the module's notes for its source)."""
    efficiency_source: str = "assumed: no published run of this GPU replayed"
    gpus_per_node: int = 8

    @property
    def fp8(self) -> bool:
        return "fp8" in self.peak_flops

    def with_links(self, nvlink_gbps: float | None = None, network_gbps: float | None = None) -> Gpu:
        """This GPU in a given cluster: NVLink and network GB/s per GPU, one direction."""
        for flag, value in (("--nvlink-gbps", nvlink_gbps), ("--network-gbps", network_gbps)):
            if value is not None and value <= 0:
                raise ValueError(f"{flag} must be positive (GB/s per GPU, one direction), got {value}")
        return dataclasses.replace(
            self, nvlink_bandwidth=self.nvlink_bandwidth if nvlink_gbps is None else nvlink_gbps * 1e9,
            network_bandwidth=self.network_bandwidth if network_gbps is None else network_gbps * 1e9)


TERA = 1e12
A100_EFFICIENCY = 0.615
"""Fitted over Megatron-LM's Table 1 by `python bench/published.py` (see its output)."""
GH100_EFFICIENCY = 0.55
"""H100's (and H200's) matmul efficiency: Megatron-LM's stated H100 MFU 0.47 x 1.18 (module notes)."""
GH100_SOURCE = "Megatron-LM README's H100 MFU (0.47) x A100's fitted efficiency / its best Table 1 MFU (1.18)"
GPUS: dict[str, Gpu] = {
    "a100": Gpu("A100 SXM 80GB", {"float32": 156 * TERA, "bfloat16": 312 * TERA, "int8": 624 * TERA},
                2.039e12, 80e9, 300e9, 25e9, 400, 21.60 / 8, efficiency=A100_EFFICIENCY,
                efficiency_source="fitted over Megatron-LM (Narayanan et al., SC21) Table 1: bench/published.py"),
    "h100": Gpu("H100 SXM", {"float32": 494.7 * TERA, "bfloat16": 989.4 * TERA, "fp8": 1978.9 * TERA,
                             "int8": 1978.9 * TERA}, 3.35e12, 80e9, 450e9, 50e9, 700, 49.24 / 8,
                efficiency=GH100_EFFICIENCY, efficiency_source=GH100_SOURCE),
    "h200": Gpu("H200 SXM", {"float32": 494.7 * TERA, "bfloat16": 989.4 * TERA, "fp8": 1978.9 * TERA,
                             "int8": 1978.9 * TERA}, 4.8e12, 141e9, 450e9, 50e9, 700, 50.44 / 8,
                efficiency=GH100_EFFICIENCY, efficiency_source=GH100_SOURCE),
    "b200": Gpu("B200", {"float32": 1100 * TERA, "bfloat16": 2250 * TERA, "fp8": 4500 * TERA, "int8": 4500 * TERA,
                         "fp4": 9000 * TERA}, 8e12, 180e9, 900e9, 50e9, 1000, 68.80 / 8),
    "b300": Gpu("B300", {"float32": 1100 * TERA, "bfloat16": 2250 * TERA, "fp8": 4500 * TERA, "fp4": 13500 * TERA},
                8e12, 288e9, 900e9, 100e9, 1100, None),
}
_DEVICE_KINDS = {"a100": "a100", "h100": "h100", "h200": "h200", "b200": "b200", "b300": "b300", "gb200": "b200",
                 "gb300": "b300"}


def get_gpu(name: str) -> Gpu:
    key = name.lower()
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}")
    return GPUS[key]


def gpu_of_device(device: jax.Device) -> Gpu | None:
    """The table entry for a device (from its device_kind, e.g. 'NVIDIA H200'), None if unknown."""
    for word in device.device_kind.lower().replace("-", " ").split():
        if word in _DEVICE_KINDS:
            return GPUS[_DEVICE_KINDS[word]]
    return None


def peak_flops(device: jax.Device, compute: str) -> float | None:
    """Peak dense FLOP/s of `device` for a compute dtype (`fp8` runs its GEMMs in FP8), if known."""
    gpu = gpu_of_device(device)
    if gpu is None:
        return None
    return gpu.peak_flops.get(compute)
