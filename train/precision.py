"""What `precision` means on a backend: the activations' dtype and bytes, and the matmuls' format.

The one mapping of precision names: the run (on the devices at hand), the MFU meter and the
planner (for the GPUs it plans for: `backend="gpu"`) all read it.
"""

from __future__ import annotations

import jax
import numpy as np


def compute_dtype(precision: str, backend: str | None = None) -> str:
    """The activations' dtype: `auto` is bfloat16 on accelerators and float32 on CPU (`backend`,
    default the devices at hand); `fp8` computes in bfloat16 around its FP8 matmuls."""
    if precision == "auto":
        return "float32" if (backend or jax.default_backend()) == "cpu" else "bfloat16"
    return "bfloat16" if precision == "fp8" else precision


def matmul_dtype(precision: str, backend: str | None = None) -> str:
    """What the blocks' matmuls run in (the peak FLOP/s that MFU divides by): fp8 or the compute dtype."""
    return "fp8" if precision == "fp8" else compute_dtype(precision, backend)


def activation_bytes(precision: str, backend: str | None = None) -> int:
    """Bytes of one activation element in the compute dtype."""
    return np.dtype(compute_dtype(precision, backend)).itemsize


def fp8_note(precision: str) -> str | None:
    """A one-line note when FP8 matmuls run on a device without FP8 tensor cores (emulated, slow)."""
    if precision != "fp8":
        return None
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    if device.platform == "gpu" and capability is not None and float(capability) >= 8.9:
        return None
    return (f"note: precision=fp8 on {device.device_kind} ({device.platform}), which has no FP8 tensor cores: "
            "the FP8 matmuls are emulated (slow); they are fast on Hopper/Blackwell GPUs")
