"""FP8 matmuls with current scaling: e4m3 operands forward, e5m2 for the incoming gradient backward.

Each operand is scaled by its own amax (one float32 scale per tensor, computed from the tensor
itself, as Transformer Engine's Float8CurrentScaling does), clipped to the format's largest finite
value before the cast (e4m3fn has no infinity: an overflowing cast would give NaN), and a zero
tensor gets scale 1. The dot accumulates in float32; its result is rescaled and returned in the
compute dtype. Stateless: no amax history, so the train state, checkpoints, optimizer, gradient
accumulation and the pipeline are the same as without FP8.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
E4M3_MAX = float(jnp.finfo(E4M3).max)  # 448
E5M2_MAX = float(jnp.finfo(E5M2).max)  # 57344


def scaled_cast(x: jax.Array, dtype, largest: float) -> tuple[jax.Array, jax.Array]:
    """(x / scale in `dtype`, scale): scale = amax(|x|) / largest (1 where x is all zero)."""
    x32 = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x32))
    scale = jnp.where(amax > 0, amax / largest, 1.0)
    return jnp.clip(x32 / scale, -largest, largest).astype(dtype), scale


def _contract(a, b, a_dims, b_dims, scale, dtype):
    dims = ((tuple(a_dims), tuple(b_dims)), ((), ()))
    return (jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32) * scale).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def fp8_dot(x: jax.Array, kernel: jax.Array, num_in: int) -> jax.Array:
    """x's last `num_in` axes contracted with the kernel's first `num_in`, in FP8 (see module doc)."""
    return _forward(x, kernel, num_in)[0]


def _forward(x, kernel, num_in):
    xq, x_scale = scaled_cast(x, E4M3, E4M3_MAX)
    wq, w_scale = scaled_cast(kernel, E4M3, E4M3_MAX)
    x_dims = range(x.ndim - num_in, x.ndim)
    y = _contract(xq, wq, x_dims, range(num_in), x_scale * w_scale, x.dtype)
    dtypes = (jnp.zeros((), x.dtype), jnp.zeros((), kernel.dtype))  # residuals must be arrays
    return y, (xq, x_scale, wq, w_scale, dtypes)


def _backward(num_in, residuals, grad):
    xq, x_scale, wq, w_scale, (x_dtype, w_dtype) = residuals
    x_dtype, w_dtype = x_dtype.dtype, w_dtype.dtype
    gq, g_scale = scaled_cast(grad, E5M2, E5M2_MAX)
    lead = xq.ndim - num_in  # batch-like axes of x (and of the output)
    num_out = wq.ndim - num_in
    # dx: the gradient's output axes against the kernel's output axes -> (lead..., in...).
    dx = _contract(gq, wq, range(lead, lead + num_out), range(num_in, num_in + num_out), g_scale * w_scale, x_dtype)
    # dw: x's lead axes against the gradient's lead axes -> (in..., out...).
    dw = _contract(xq, gq, range(lead), range(lead), x_scale * g_scale, w_dtype)
    return dx, dw


fp8_dot.defvjp(lambda x, kernel, num_in: _forward(x, kernel, num_in), _backward)
