"""Peak dense matmul rates, memory bandwidth and interconnects of the GPUs the planner knows.

Dense (no 2:4 sparsity) tensor-core figures per GPU, SXM parts:
- H100 SXM: NVIDIA H100 Tensor Core GPU datasheet (BF16 1,979 TFLOPS and FP8 3,958 TFLOPS "with
  sparsity", i.e. 989.4 and 1,978.9 dense; TF32 494.7 dense; HBM3 3.35 TB/s; NVLink 900 GB/s).
- H200 SXM: NVIDIA H200 Tensor Core GPU datasheet (the same GH100 tensor cores as H100 SXM: BF16
  989 / FP8 1,979 dense; HBM3e 4.8 TB/s, 141 GB; NVLink 900 GB/s).
- B200: NVIDIA HGX B200 / DGX B200 datasheets (per 8 GPUs, sparse: FP4 144 PF, FP8 72 PF, BF16
  36 PF, TF32 18 PF -> per GPU dense: FP4 9, FP8 4.5, BF16 2.25, TF32 1.1 PFLOPS; HBM3e 8 TB/s,
  180 GB; NVLink 5 1.8 TB/s).
- B300: NVIDIA HGX B300 platform page (per 8 GPUs: FP4 108 PF dense, FP8 72 PF and BF16 36 PF
  sparse -> per GPU dense: FP4 13.5, FP8 4.5, BF16 2.25 PFLOPS; HBM3e 8 TB/s, 288 GB; NVLink 5
  1.8 TB/s), as tabulated at glennklockwood.com/garden/processors/B300.
NVLink figures are both directions together; one direction is half. The network figure is one
400 Gb/s (B300: 800 Gb/s, ConnectX-8) NIC per GPU, as in the DGX/HGX reference designs.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: dict[str, float]
    """Dense tensor-core FLOP/s by compute dtype (`float32` means TF32 tensor cores)."""
    memory_bandwidth: float
    """HBM bytes/s."""
    memory_bytes: float
    nvlink_bandwidth: float
    """Bytes/s per GPU, one direction."""
    network_bandwidth: float
    """Bytes/s per GPU across nodes, one direction."""
    fp8: bool = True


TERA = 1e12
GPUS: dict[str, Gpu] = {
    "h100": Gpu("H100 SXM", {"float32": 494.7 * TERA, "bfloat16": 989.4 * TERA, "fp8": 1978.9 * TERA},
                3.35e12, 80e9, 450e9, 50e9),
    "h200": Gpu("H200 SXM", {"float32": 494.7 * TERA, "bfloat16": 989.4 * TERA, "fp8": 1978.9 * TERA},
                4.8e12, 141e9, 450e9, 50e9),
    "b200": Gpu("B200", {"float32": 1100 * TERA, "bfloat16": 2250 * TERA, "fp8": 4500 * TERA, "fp4": 9000 * TERA},
                8e12, 180e9, 900e9, 50e9),
    "b300": Gpu("B300", {"float32": 1100 * TERA, "bfloat16": 2250 * TERA, "fp8": 4500 * TERA, "fp4": 13500 * TERA},
                8e12, 288e9, 900e9, 100e9),
}
_DEVICE_KINDS = {"h100": "h100", "h200": "h200", "b200": "b200", "b300": "b300", "gb200": "b200", "gb300": "b300"}


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
