"""Weight-only quantization of matmul kernels for inference: int8, fp8 (e4m3) and fp4 (NVFP4).

A kernel (lead..., in..., out...) is viewed as (lead..., K, N): K = prod(in), N = prod(out); the
leading axes are stacked layers. Stored arrays (all plain integer/float dtypes, so any checkpoint
format keeps them):
- int8: `codes` int8 (lead..., in..., out...), `scale` float32 (lead..., out...): symmetric, one
  scale per output channel, amax / 127.
- fp8: `codes` uint8 holding e4m3fn bits (lead..., in..., out...), `scale` float32 per output
  channel, amax / 448; values clipped to +-448 before the cast (e4m3fn has no infinity).
- fp4: `codes` uint8 (lead..., K/2, N), two e2m1 values per byte (the even K index in the low
  nibble); `block_scale` uint8 holding e4m3 bits (lead..., K/16, N), one per 16 consecutive inputs
  of an output channel; `global_scale` float32 (lead...,): amax / (6 * 448), the NVFP4 layout.
Quantizing runs on the host (numpy); dequantizing runs inside the jitted forward, per layer.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

FORMATS = ("int8", "fp8", "fp4")
FP4_BLOCK = 16
E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
"""The float value of each 4-bit e2m1 code (bit 3 is the sign)."""


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise ValueError(f"unknown quantization format {name!r}; choose one of {', '.join(FORMATS)}")
    return name


def _matrix(kernel: np.ndarray, lead: int, num_in: int) -> np.ndarray:
    shape = kernel.shape
    k = math.prod(shape[lead : lead + num_in])
    return np.asarray(kernel, np.float32).reshape(*shape[:lead], k, math.prod(shape[lead + num_in :]))


def _safe(amax: np.ndarray, largest: float) -> np.ndarray:
    return np.where(amax > 0, amax / largest, 1.0).astype(np.float32)


def quantize(kernel: np.ndarray, fmt: str, lead: int, num_in: int) -> dict[str, np.ndarray]:
    """The stored arrays of one kernel (see the module doc); `lead` stacked axes, `num_in` input axes."""
    check_format(fmt)
    shape = kernel.shape
    out_shape = shape[lead + num_in :]
    w = _matrix(kernel, lead, num_in)  # (lead..., K, N)
    if fmt in ("int8", "fp8"):
        largest = 127.0 if fmt == "int8" else E4M3_MAX
        scale = _safe(np.abs(w).max(axis=-2, keepdims=True), largest)
        scaled = np.clip(w / scale, -largest, largest)
        codes = (np.round(scaled).astype(np.int8) if fmt == "int8"
                 else scaled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
        return {"codes": codes.reshape(shape), "scale": scale.reshape(*shape[:lead], *out_shape)}
    k = w.shape[-2]
    if k % FP4_BLOCK:
        raise ValueError(f"fp4 needs the input size of every quantized kernel to divide by {FP4_BLOCK}; "
                         f"a kernel of shape {shape} has {k} inputs: use int8 or fp8")
    global_scale = _safe(np.abs(w).max(axis=(-2, -1), keepdims=True), E2M1_MAX * E4M3_MAX)
    blocks = w.reshape(*w.shape[:-2], k // FP4_BLOCK, FP4_BLOCK, w.shape[-1])
    block_amax = np.abs(blocks).max(axis=-2)  # (lead..., K/16, N)
    block_scale = np.clip(block_amax / E2M1_MAX / global_scale, 0, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    effective = block_scale.astype(np.float32) * global_scale
    effective = np.where(effective > 0, effective, 1.0)[..., None, :]
    values = np.clip(blocks / effective, -E2M1_MAX, E2M1_MAX).astype(ml_dtypes.float4_e2m1fn)
    nibbles = values.view(np.uint8).reshape(w.shape) & 0xF
    packed = nibbles[..., 0::2, :] | (nibbles[..., 1::2, :] << 4)
    return {"codes": packed.astype(np.uint8), "block_scale": block_scale.view(np.uint8),
            "global_scale": global_scale.reshape(shape[:lead])}


def unpack_fp4(packed: jax.Array) -> jax.Array:
    """(..., K/2, N) uint8 -> (..., K, N) float32 e2m1 values (works on numpy and in jit)."""
    low, high = packed & 0xF, packed >> 4
    codes = jnp.stack([low, high], axis=-2).reshape(*packed.shape[:-2], 2 * packed.shape[-2], packed.shape[-1])
    return jnp.asarray(E2M1_VALUES)[codes.astype(jnp.int32)]


def dequantize(stored: dict[str, jax.Array], fmt: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
               dtype) -> jax.Array:
    """One layer's kernel (in..., out...) in `dtype` from its stored arrays (no leading axes)."""
    if fmt == "int8":
        return (stored["codes"].astype(jnp.float32) * stored["scale"]).astype(dtype)
    if fmt == "fp8":
        values = jax.lax.bitcast_convert_type(stored["codes"], jnp.float8_e4m3fn).astype(jnp.float32)
        return (values * stored["scale"]).astype(dtype)
    values = unpack_fp4(stored["codes"])  # (K, N)
    scale = jax.lax.bitcast_convert_type(stored["block_scale"], jnp.float8_e4m3fn).astype(jnp.float32)
    scale = jnp.repeat(scale, FP4_BLOCK, axis=-2) * stored["global_scale"]
    return (values * scale).reshape(*in_shape, *out_shape).astype(dtype)


def stored_shapes(fmt: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Shapes of the stored arrays of one layer's kernel."""
    if fmt in ("int8", "fp8"):
        return {"codes": (*in_shape, *out_shape), "scale": tuple(out_shape)}
    k, n = math.prod(in_shape), math.prod(out_shape)
    return {"codes": (k // 2, n), "block_scale": (k // FP4_BLOCK, n), "global_scale": ()}
